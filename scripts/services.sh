#!/usr/bin/env bash
# Sourced, from the repository root, by scripts/test.sh and bench/run.sh: starts (or reuses)
# the local RabbitMQ and PostgreSQL (scripts/rabbitmq.sh, scripts/postgres.sh) and exports
# the URLs the end-to-end tests and the benchmarks read.
#
#   source scripts/services.sh
CARTEIRO_TEST_AMQP_URL="$(scripts/rabbitmq.sh start | tail -n 1)"
CARTEIRO_TEST_POSTGRES_URL="$(scripts/postgres.sh start | tail -n 1)"
export CARTEIRO_TEST_AMQP_URL CARTEIRO_TEST_POSTGRES_URL
echo "rabbitmq:   $CARTEIRO_TEST_AMQP_URL"
echo "postgresql: $CARTEIRO_TEST_POSTGRES_URL"
