# Sourced by the scripts that build a tool from its Go modules (deploy/otel/build.sh,
# deploy/prometheus/build-v3.sh, deploy/compose/compose-v2.sh): a Go toolchain of at least GO_MIN on
# PATH. The one on PATH or in /usr/local/go when it is recent enough; else the toolchain the Go module
# proxy serves as a module (golang.org/toolchain, as `GOTOOLCHAIN` fetches it), unpacked once into
# ~/.cache/llmbus/go-<version>. Debian 12's golang-go (1.19) is too old for these modules.
GO_MIN=${GO_MIN:-1.22}
GO_FETCH_VERSION=${GO_FETCH_VERSION:-1.23.4}

# go_recent GO: true if the binary GO runs and is at least GO_MIN.
go_recent() {
  local version
  version=$("$1" env GOVERSION 2>/dev/null) || return 1
  version=${version#go}
  [ "$(printf '%s\n%s\n' "$GO_MIN" "$version" | sort -V | head -1)" = "$GO_MIN" ]
}

# use_go TAG: puts a recent enough go first on PATH (TAG prefixes its messages on stderr).
use_go() {
  local tag=$1 cache=${LLMBUS_CACHE:-$HOME/.cache/llmbus} candidate
  for candidate in "$(command -v go 2>/dev/null)" /usr/local/go/bin/go "$cache/go-$GO_FETCH_VERSION/bin/go"; do
    if [ -n "$candidate" ] && [ -x "$candidate" ] && go_recent "$candidate"; then
      PATH=$(dirname "$candidate"):$PATH
      export PATH
      return 0
    fi
  done
  local proxy=${GOPROXY:-https://proxy.golang.org}
  proxy=${proxy%%,*}
  local module="golang.org/toolchain/@v/v0.0.1-go$GO_FETCH_VERSION.linux-$(go_arch)"
  local dest=$cache/go-$GO_FETCH_VERSION tmp
  echo "[$tag] no Go >= $GO_MIN found: fetching go$GO_FETCH_VERSION from $proxy (once)" >&2
  command -v unzip >/dev/null || apt-get install -y -qq unzip >/dev/null
  tmp=$(mktemp -d "$cache/go-fetch.XXXXXX")
  curl -fsSL --retry 3 --max-time 600 -o "$tmp/go.zip" "$proxy/$module.zip"
  unzip -q "$tmp/go.zip" -d "$tmp"
  rm -rf "$dest"
  mv "$tmp"/golang.org/toolchain@*/ "$dest"
  rm -rf "$tmp"
  chmod +x "$dest"/bin/* "$dest"/pkg/tool/*/* 2>/dev/null || true
  PATH=$dest/bin:$PATH
  export PATH
  go_recent "$dest/bin/go" || { echo "[$tag] the fetched toolchain does not run" >&2; exit 1; }
}

go_arch() {
  case $(uname -m) in
    x86_64) echo amd64 ;;
    aarch64 | arm64) echo arm64 ;;
    *) uname -m ;;
  esac
}
