//! End-to-end tests: real `.wasm` components, a real RabbitMQ and real databases.
//! Run through `scripts/test.sh`, which builds the plugins and starts the services.

mod app_outbox;
mod batch;
mod blackhole;
mod cdc;
mod cdc_process;
mod console;
mod edit;
mod exactly_once;
mod gateway;
mod hostile;
mod hostile_props;
mod instance_reuse;
mod journey;
mod languages;
mod live;
mod log_injection;
mod operators;
mod outages;
mod prometheus;
mod relay;
mod relay_bytes;
mod relay_model;
mod relay_parked;
mod replay;
mod resilience;
mod runtime;
mod scaffold;
mod seal;
mod secrets;
mod standard;
mod store_faults;
mod support;
mod telemetry;
mod tls;
mod write_refusals;
