# OVERLORD in a container, on the fuse backend (fuse-overlayfs through the setuid fusermount3):
# the workspace and console (`overlord ui`) over HTTPS on port 7777, as the non-root user
# `overlord` (uid 10001), with OVERLORD_HOME on a data volume. The image holds everything it
# runs: nothing is fetched when a container starts.
#
# Build:
#   docker build -t overlord .
#
# First, once, in the data volume (a new named volume takes /data's owner from the image):
# the certificate, for the name browsers use (localhost here; the CMD's --host must match),
# and the first admin account (the password on stdin, one line; -it instead asks twice):
#   docker volume create overlord-data
#   docker run --rm -v overlord-data:/data overlord overlord tls selfsign --host localhost
#   printf '%s\n' "$ADMIN_PASSWORD" | \
#     docker run --rm -i -v overlord-data:/data overlord overlord users add --role admin alice
#
# Run:
#   docker run -d --name overlord --device /dev/fuse --cap-add SYS_ADMIN \
#     [--security-opt apparmor=unconfined] -v overlord-data:/data -p 7777:7777 overlord
#   then open https://localhost:7777/ and sign in; `docker logs overlord`: one JSON line a
#   request; `docker exec overlord overlord doctor`: what the backend is here.
#
# --device /dev/fuse: fuse-overlayfs talks to the kernel through it. --cap-add SYS_ADMIN: the
# mount(2) of each session's overlay is made by the setuid fusermount3, which gets root's
# capabilities only within the container's bounding set (the server itself runs as overlord
# and holds none). --security-opt apparmor=unconfined, on AppArmor hosts (Ubuntu, Debian, and
# Docker Desktop's VM where AppArmor is on): Docker's default profile (docker-default) denies
# every mount, fusermount3's too. The kernel backend needs user namespaces and a /proc mount a
# container's masked /proc does not allow, so `overlord doctor` names fuse as the backend here.
# Projects: mount them under /projects (new conversations start there), writable by uid 10001,
# e.g. -v /srv/app:/projects/app. Another name than localhost: `overlord tls selfsign --host
# NAME` and the CMD below with --host NAME (given after the image name).
FROM debian:trixie-slim

ARG DEBIAN_FRONTEND=noninteractive
COPY . /src
# the runtime packages; the compiler only for the launcher (static where libc.a exists, so
# gcc and libc6-dev go again); install.sh --no-deps: the engine, the launcher, the units, the
# skills under /usr/local, then its `overlord doctor` (OVERLORD_HOME in a throwaway dir);
# then the account and its home (the downloaded .debs: the base image's
# /etc/apt/apt.conf.d/docker-clean removes them after every apt-get run); /etc/mtab, which
# `fusermount3 -u` reads to unmount a session: Docker adds it to a container, the image has
# none, and other engines (apptainer, a plain chroot) do not add it
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      python3 fuse-overlayfs fuse3 strace git gcc libc6-dev ca-certificates openssl \
 && OVERLORD_HOME=/tmp/overlord-build bash /src/packaging/install.sh --no-deps \
 && rm -rf /tmp/overlord-build /src \
 && apt-get purge -y --auto-remove gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 overlord \
 && useradd --system --uid 10001 --gid overlord --home-dir /data --no-create-home \
      --shell /usr/sbin/nologin overlord \
 && install -d -o overlord -g overlord -m 0700 /data \
 && install -d -o overlord -g overlord -m 0755 /projects \
 && ln -sfn ../proc/self/mounts /etc/mtab

ENV OVERLORD_HOME=/data
VOLUME /data
WORKDIR /projects
EXPOSE 7777
USER overlord
# /healthz answers before any sign-in; the Host header is one the server allows (--host)
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
  CMD ["python3", "-I", "-c", "import ssl, urllib.request as u; u.urlopen(u.Request('https://127.0.0.1:7777/healthz', headers={'Host': 'localhost:7777'}), context=ssl._create_unverified_context(), timeout=4)"]
CMD ["overlord", "ui", "--bind", "0.0.0.0", "--port", "7777", "--host", "localhost", "--tls-cert", "/data/tls/cert.pem", "--tls-key", "/data/tls/key.pem", "--log-json"]
