#!/bin/sh
# The image's entry point: SageMaker runs `IMAGE train` or `IMAGE serve`; anything else runs as
# given (`docker run -it IMAGE bash`). `exec` replaces this shell, so signals reach byoc directly.
set -e
[ "$#" -gt 0 ] || set -- train
case "$1" in
    train|serve) exec byoc "$@" ;;
    *) exec "$@" ;;
esac
