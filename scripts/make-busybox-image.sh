#!/usr/bin/env bash
# Build the `agentd-busybox:latest` image from the host's static busybox, since no registry
# is reachable here. Idempotent: does nothing when the image exists. Uses $DOCKER_HOST.
# Usage: scripts/make-busybox-image.sh [NAME:TAG]
set -euo pipefail

image=${1:-agentd-busybox:latest}
if docker image inspect "$image" >/dev/null 2>&1; then
    echo "$image already present"
    exit 0
fi

bb=$(command -v busybox) || { echo "busybox not found (apt-get install busybox-static)" >&2; exit 1; }
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/bin" "$root/tmp" "$root/work" "$root/etc"
chmod 1777 "$root/tmp"
cp "$bb" "$root/bin/busybox"
for applet in $("$root/bin/busybox" --list); do
    [ -e "$root/bin/$applet" ] || ln -s busybox "$root/bin/$applet"
done
# Minimal passwd/group so `id`, `whoami` and user switches resolve names.
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$root/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
tar -C "$root" -c . | docker import \
    --change 'ENV PATH=/bin' --change 'CMD ["/bin/sh"]' - "$image" >/dev/null
echo "$image built"
