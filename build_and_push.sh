#!/usr/bin/env bash
# Build one flavour of the byoc image and push it to Amazon ECR; print the image URI.
#
#   ./build_and_push.sh neuron|gpu|serve [--region R] [--repository NAME] [--tag T] [--dry-run]
#
# gpu and neuron train and serve (on the AWS DLCs); serve is the slim serving image (Dockerfile.serve).
# The account comes from `aws sts get-caller-identity`; the repository (default byoc-<flavour>) is
# created if missing. The image is tagged <tag> (default: the byoc version and the git sha) and
# <flavour> (a moving tag), then pushed. --dry-run prints every aws/docker command instead of
# running it (credentials are still checked unless BYOC_DRY_RUN_ACCOUNT is set).
set -euo pipefail

usage() {
    sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'
}

die() {
    echo "build_and_push.sh: $*" >&2
    exit 1
}

flavour=""
region="${AWS_REGION:-${AWS_DEFAULT_REGION:-}}"
repository=""
tag=""
dry_run=0
while [ "$#" -gt 0 ]; do
    case "$1" in
        gpu|neuron|serve) flavour="$1" ;;
        --region) [ "$#" -ge 2 ] || die "--region needs a value"; region="$2"; shift ;;
        --repository) [ "$#" -ge 2 ] || die "--repository needs a value"; repository="$2"; shift ;;
        --tag) [ "$#" -ge 2 ] || die "--tag needs a value"; tag="$2"; shift ;;
        --dry-run) dry_run=1 ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; die "unknown argument '$1': the flavour is gpu, neuron or serve" ;;
    esac
    shift
done
[ -n "$flavour" ] || { usage >&2; die "which flavour? give gpu, neuron or serve"; }
[ -n "$region" ] || die "no AWS region: pass --region or set AWS_REGION"
cd "$(dirname "$0")"

run() {
    if [ "$dry_run" = 1 ]; then
        echo "+ $*"
    else
        "$@"
    fi
}

command -v docker >/dev/null 2>&1 || die "docker is not installed (or not on PATH)"
command -v aws >/dev/null 2>&1 || die "the AWS CLI is not installed: https://docs.aws.amazon.com/cli/"
if [ "$dry_run" = 0 ]; then
    docker info >/dev/null 2>&1 || die "cannot reach the Docker engine: is dockerd running, and may this user use it?"
fi

if [ -n "${BYOC_DRY_RUN_ACCOUNT:-}" ] && [ "$dry_run" = 1 ]; then
    account="$BYOC_DRY_RUN_ACCOUNT"
else
    account="$(aws sts get-caller-identity --query Account --output text 2>/dev/null)" \
        || die "no AWS credentials: configure them (aws configure, AWS_PROFILE, or an instance role)"
fi
if [ -z "$account" ] || [ "$account" = "None" ]; then
    die "aws sts get-caller-identity returned no account"
fi

version="$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)"
sha="$(git rev-parse --short HEAD 2>/dev/null || echo nogit)"
repository="${repository:-byoc-$flavour}"
tag="${tag:-$version-$sha}"
registry="$account.dkr.ecr.$region.amazonaws.com"
image="$registry/$repository"

# The base image: the ARG default in the Dockerfile. A DLC comes from AWS's registry in your region, after a
# login; the serving image's slim Python base from ECR Public, which needs none.
base="$(sed -n 's/^ARG BASE_IMAGE=//p' "Dockerfile.$flavour")"
base_registry=""
if [[ "$base" == *.dkr.ecr.us-east-1.amazonaws.com/* ]]; then
    base="${base/.us-east-1./.$region.}"
    base_registry="${base%%/*}"
fi

if ! run aws ecr describe-repositories --region "$region" --repository-names "$repository" >/dev/null 2>&1; then
    echo "creating the ECR repository $repository in $region"
    run aws ecr create-repository --region "$region" --repository-name "$repository" \
        --image-scanning-configuration scanOnPush=true >/dev/null
fi

# A dry run prints the pipeline whole: piping one `run` into another lost the first line and, when
# the echo on the right exited first, killed the one on the left with SIGPIPE (exit 141).
login() {
    if [ "$dry_run" = 1 ]; then
        echo "+ aws ecr get-login-password --region $region | docker login --username AWS --password-stdin $1"
    else
        aws ecr get-login-password --region "$region" | docker login --username AWS --password-stdin "$1"
    fi
}

if [ -n "$base_registry" ]; then
    echo "logging in to $base_registry (base image) and $registry"
    login "$base_registry"
else
    echo "logging in to $registry (the base image, $base, needs no login)"
fi
login "$registry"

echo "building $image:$tag from Dockerfile.$flavour"
started=$(date +%s)
run docker build --file "Dockerfile.$flavour" --build-arg "BASE_IMAGE=$base" \
    --build-arg "BYOC_IMAGE=$image:$tag" --tag "$image:$tag" --tag "$image:$flavour" .
echo "built in $(( $(date +%s) - started )) s"

run docker push "$image:$tag"
run docker push "$image:$flavour"
echo "$image:$tag"
