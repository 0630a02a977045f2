#!/usr/bin/env bash
# Start each local service the services suite needs, if it is not already running.
set -u
up() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
wait_up() { for _ in $(seq 1 60); do up "$1" && return 0; sleep 1; done; echo "service on port $1 did not start" >&2; return 1; }

if ! up 5432; then
  echo "starting PostgreSQL"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql)" main start || true
  wait_up 5432 || exit 1
fi
if ! up 6379; then
  echo "starting Redis"
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log || true
  wait_up 6379 || exit 1
fi
if ! up 5672; then
  echo "starting RabbitMQ"
  rabbitmq-server -detached || true
  wait_up 5672 || exit 1
fi
echo "PostgreSQL, Redis and RabbitMQ are up"
