#!/bin/sh
# autogen.sh - prepare a fresh checkout for ./configure (runs autoreconf).
# On a Debian/Ubuntu machine without the build tools: as root, installs them
# with apt-get (saying so); otherwise prints the exact command to run.
set -e
cd "$(dirname "$0")"
need=""
for tool in autoreconf:autoconf automake:automake libtoolize:libtool pkg-config:pkg-config; do
    cmd=${tool%%:*}; pkg=${tool##*:}
    command -v "$cmd" >/dev/null 2>&1 || need="$need $pkg"
done
if [ -n "$need" ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "autogen.sh: installing the build tools with apt-get:$need" >&2
        DEBIAN_FRONTEND=noninteractive apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $need build-essential
    else
        echo "autogen.sh: missing build tools:$need" >&2
        echo "autogen.sh: run: sudo apt-get install -y$need build-essential" >&2
        exit 1
    fi
fi
mkdir -p m4 build-aux
autoreconf --install --force
echo "autogen.sh: now run ./configure && make"
