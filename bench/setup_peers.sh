#!/usr/bin/env bash
# Install the peer brokers and their Python clients for bench/compare.py.
#
#   redis-server   Debian package (Redis Streams, AOF persistence)
#   nats-server    Debian package (JetStream with file storage)
#   rabbitmq-server Debian package (the work-queue workload only; Erlang comes with it)
#   redis, nats-py, pika  Python clients (pip)
#   py-spy         sampling profiler for the broker processes (pip)
#
# Needs root for apt-get. compare.py itself never installs anything.
set -euo pipefail

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update
$SUDO apt-get install -y --no-install-recommends redis-server nats-server rabbitmq-server

# The Debian packages start their own service where a service manager runs; compare.py starts
# its own servers on free loopback ports, so stop any that came up.
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    $SUDO systemctl stop redis-server nats-server rabbitmq-server 2>/dev/null || true
    $SUDO systemctl disable redis-server nats-server rabbitmq-server 2>/dev/null || true
fi

PYTHON="${PYTHON:-python3}"
"$PYTHON" -m pip install --upgrade "redis>=5" "nats-py>=2.6" "pika>=1.3" "py-spy>=0.3"

echo "redis-server: $(redis-server --version)"
echo "nats-server:  $(nats-server --version)"
echo "rabbitmq-server: $(dpkg-query -W -f '${Version}' rabbitmq-server)"
"$PYTHON" -c 'import redis, nats; print("redis-py", redis.__version__); from importlib.metadata import version; print("nats-py", version("nats-py")); print("pika", version("pika"))'
