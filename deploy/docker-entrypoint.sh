#!/bin/sh
# Start `microbatch serve` in a container (the Dockerfile's ENTRYPOINT; the test
# tests/ops/test_deploy.py runs it too).
#
#   MICROBATCH_TARGET    what to serve, MODULE:ATTR (required)
#   MICROBATCH_<FLAG>    any other serve setting (the image sets MICROBATCH_HOST=0.0.0.0
#                        and MICROBATCH_LOG_FORMAT=json); arguments given to the
#                        container are passed on as flags, which win over the environment.
#   MICROBATCH_AUTH_TOKEN  the bearer token (in Kubernetes: from a Secret)
#
# exec: the server is PID 1's replacement, so SIGTERM from `docker stop` or the
# kubelet reaches it directly and starts its drain.
set -eu
if [ -z "${MICROBATCH_TARGET:-}" ]; then
    echo "docker-entrypoint: set MICROBATCH_TARGET to MODULE:ATTR (e.g. examples.embeddings:service)" >&2
    exit 2
fi
exec "${MICROBATCH_COMMAND:-microbatch}" serve "$MICROBATCH_TARGET" "$@"
