#!/bin/sh
# The image's entry point: SageMaker runs `IMAGE train` or `IMAGE serve`; `docker run IMAGE encode` runs
# `byoc encode`; anything else runs as given (`docker run -it IMAGE bash`). `exec` replaces this shell, so
# signals reach byoc directly.
set -e
[ "$#" -gt 0 ] || set -- train
case "$1" in
    train|serve|encode) exec byoc "$@" ;;
    *) exec "$@" ;;
esac
