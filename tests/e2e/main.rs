//! End-to-end tests: real `.wasm` components, a real RabbitMQ and real databases.
//! Run through `scripts/test.sh`, which builds the plugins and starts the services.

mod gateway;
mod resilience;
mod runtime;
mod support;
