//! End-to-end suite: a real kube-apiserver calls the webhooks and a real controller-manager,
//! scheduler and kwok run the workloads the operator creates. See support/ for the harness.

mod archiving;
mod backup_jobs;
mod backups;
mod certificates;
mod chart;
mod controller;
mod healing;
mod hibernation;
mod instance_policy;
mod leader;
mod manual_examples;
mod network_policy;
#[path = "../support/object_store.rs"]
mod object_store;
mod pipeline;
mod placement;
mod plugin;
#[path = "../support/ports.rs"]
mod ports;
mod quiet;
mod smoke;
mod support;
mod webhook;
