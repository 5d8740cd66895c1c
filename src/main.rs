use dbservice_operator::api::crd;
use dbservice_operator::cli::{Cli, Command, CrdArgs, LogFormat, RunArgs};
use dbservice_operator::{run, telemetry};

/// mimalloc instead of the C library's allocator: the shipped binary is static musl, whose
/// allocator held the HTTPS webhook to ~9,000 requests/s (~26,000 with mimalloc) and doubled the
/// controller's CPU (benches/README.md). Built without transparent huge pages (`no_thp`): a 2 MiB
/// page per arena would more than double the webhook's idle memory.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `mi_option_purge_delay` in mimalloc v3's `mi_option_e` (mimalloc.h of libmimalloc-sys 0.1.49).
#[cfg(feature = "mimalloc")]
const MIMALLOC_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Returns freed memory to the system at once instead of after mimalloc's default 1 s: a burst
/// of reconciles or admission requests must not raise the peak the memory limit is sized for.
fn tune_allocator() {
    // SAFETY: mi_option_set only stores a value in mimalloc's option table.
    #[cfg(feature = "mimalloc")]
    unsafe {
        libmimalloc_sys::mi_option_set(MIMALLOC_PURGE_DELAY, 0)
    };
}

#[tokio::main]
async fn main() {
    tune_allocator();
    let cli = Cli::parse_or_exit();
    let result = match cli.command {
        Some(Command::Run(args)) => {
            telemetry::init(args.webhook.log_format);
            run::run(args).await
        }
        None => {
            let args = default_run_args();
            telemetry::init(args.webhook.log_format);
            run::run(args).await
        }
        Some(Command::Webhook(args)) => {
            telemetry::init(args.log_format);
            run::webhook(args).await
        }
        Some(Command::Crd(args)) => {
            print_crd(&args);
            Ok(())
        }
        Some(Command::Certs(args)) => run::certs(args),
        Some(Command::Instance(args)) => {
            telemetry::init(LogFormat::Text);
            dbservice_operator::instance::command(args).await
        }
        Some(Command::Pooler(args)) => {
            telemetry::init(LogFormat::Text);
            match args.command {
                dbservice_operator::pooler::PoolerCommand::Run(args) => dbservice_operator::pooler::run(args).await,
            }
        }
        Some(Command::InstallBinary(args)) => dbservice_operator::instance::run::install_binary(&args),
        Some(Command::WalArchive(args)) => {
            dbservice_operator::store::wal::archive_command(args).await.map_err(Into::into)
        }
        Some(Command::WalRestore(args)) => wal_restore(args).await,
        Some(Command::Backup(args)) => dbservice_operator::store::base::backup_command(args).await.map_err(Into::into),
        Some(Command::Restore(args)) => {
            dbservice_operator::store::restore::restore_command(args).await.map_err(Into::into)
        }
        Some(Command::BackupList(args)) => {
            dbservice_operator::store::commands::list_command(args).await.map_err(Into::into)
        }
        Some(Command::BackupPrune(args)) => {
            dbservice_operator::store::commands::prune_command(args).await.map_err(Into::into)
        }
        Some(Command::Backups(args)) => run::backups(args).await,
        Some(Command::Switchover(args)) => run::switchover(args).await,
        Some(Command::Fence(args)) => run::fence(args, true).await,
        Some(Command::Unfence(args)) => run::fence(args, false).await,
        Some(Command::BackupNow(args)) => run::backup_now(args).await,
        Some(Command::Hibernate(args)) => run::hibernate(args, true).await,
        Some(Command::Wake(args)) => run::hibernate(args, false).await,
        Some(Command::Restart(args)) => run::request(args, dbservice_operator::plugin::Request::Restart).await,
        Some(Command::Reload(args)) => run::request(args, dbservice_operator::plugin::Request::Reload).await,
        Some(Command::Report(args)) => run::report(args).await,
        Some(Command::Psql(args)) => run::psql(args).await,
        Some(Command::Logs(args)) => run::logs(args).await,
        Some(Command::Completion(args)) => {
            run::completion(args);
            Ok(())
        }
        Some(Command::Status(args)) => run::status(args).await,
        Some(Command::Ledger(args)) => {
            telemetry::init(LogFormat::Text);
            run::ledger(args).await
        }
    };
    if let Err(error) = result {
        eprintln!("error: {error:#}");
        std::process::exit(1);
    }
}

/// `run` is the default: its flags parsed from the environment alone.
fn default_run_args() -> RunArgs {
    <RunArgs as clap::FromArgMatches>::from_arg_matches(
        &<RunArgs as clap::Args>::augment_args(clap::Command::new("run")).get_matches_from(["run"]),
    )
    .expect("defaults parse")
}

/// `dbservice-operator crd`: the CustomResourceDefinition asked for, as YAML.
fn print_crd(args: &CrdArgs) {
    use dbservice_operator::api::database_service_backup as backup_api;
    use dbservice_operator::cli::CrdKind;
    if args.reference {
        let definition = match args.kind {
            CrdKind::DatabaseService => crd::custom_resource_definition(),
            CrdKind::Backup => backup_api::custom_resource_definition(),
        };
        print!("{}", dbservice_operator::api::reference::markdown(&definition));
        return;
    }
    print!(
        "{}",
        match (args.kind, args.spec_only) {
            (CrdKind::DatabaseService, true) => crd::crd_spec_yaml(),
            (CrdKind::DatabaseService, false) => crd::crd_yaml(),
            (CrdKind::Backup, true) => backup_api::crd_spec_yaml(),
            (CrdKind::Backup, false) => backup_api::crd_yaml(),
        }
    );
}

/// `dbservice-operator wal-restore`: a failure exits at once with the status PostgreSQL reads
/// (a missing segment and a failure differ for it).
async fn wal_restore(args: dbservice_operator::store::config::WalRestoreArgs) -> anyhow::Result<()> {
    let standby = args.standby;
    match dbservice_operator::store::wal::restore_command(args).await {
        Err(error) => {
            eprintln!("error: {error}");
            std::process::exit(dbservice_operator::store::wal::restore_exit_status(&error, standby));
        }
        Ok(()) => Ok(()),
    }
}
