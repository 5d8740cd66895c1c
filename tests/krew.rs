//! `scripts/krew-manifest.sh` packs the binary as krew's `dbservice` plugin: an archive holding
//! `kubectl-dbservice`, and a manifest krew accepts (`kubectl krew install --manifest --archive`)
//! naming that archive's sha256 and the binary.

#[test]
fn the_krew_manifest_names_the_archive_by_its_sha256_and_the_plugin_binary() {
    let out = tempfile::tempdir().unwrap();
    let output = std::process::Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/krew-manifest.sh"))
        .args([env!("CARGO_BIN_EXE_dbservice-operator"), out.path().to_str().unwrap(), "v9.9.9"])
        .output()
        .expect("the script runs");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let manifest: serde_json::Value =
        serde_saphyr::from_str(&std::fs::read_to_string(out.path().join("dbservice.yaml")).unwrap()).unwrap();
    assert_eq!(manifest["apiVersion"], "krew.googlecontainertools.github.com/v1alpha2");
    assert_eq!((manifest["kind"].as_str(), manifest["metadata"]["name"].as_str()), (Some("Plugin"), Some("dbservice")));
    assert_eq!(manifest["spec"]["version"], "v9.9.9");
    let platform = &manifest["spec"]["platforms"][0];
    assert_eq!(platform["bin"], "kubectl-dbservice");
    let archive = std::fs::read(out.path().join("kubectl-dbservice-linux-amd64.tar.gz")).unwrap();
    let digest = dbservice_operator::store::signing::sha256_hex(&archive);
    assert_eq!(platform["sha256"].as_str(), Some(digest.as_str()), "the manifest names the archive it was made with");
    let listed = std::process::Command::new("tar")
        .args(["-tzf", out.path().join("kubectl-dbservice-linux-amd64.tar.gz").to_str().unwrap()])
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(listed.lines().any(|line| line == "kubectl-dbservice"), "{listed}");
}
