"""Tiny package servers on 127.0.0.1 (the host's network namespace) for the real-client tests.

One threaded HTTP/1.0 server (`Index`) serves, from memory:
  - a PyPI "simple" index (PEP 503): /simple/ and /simple/<name>/ listing a wheel built here
    with zipfile (a .dist-info with METADATA, WHEEL and RECORD), linked with its sha256
    fragment, the wheel itself under /files/;
  - an npm registry: GET /<name> answers the packument (versions, dist.tarball, shasum,
    integrity), the tarball (built here with tarfile, package/package.json inside) under
    /<name>/-/<name>-<version>.tgz;
  - a dumb-HTTP git repository: a bare repo made with git, `git update-server-info`, every file
    of it served as a static file under /<repo>.git/ (the query string is ignored, as a static
    server does: git then sees the dumb protocol);
  - plain files for curl.

Every request the server sees is appended to `Index.hits` (method, path with its query, status,
body bytes sent, the request headers) before the body is written, so a client that has its
answer finds its hit already there.
"""
import base64
import hashlib
import http.server
import io
import json
import os
import subprocess
import tarfile
import threading
import time
import zipfile

GIT_ENV = {"GIT_AUTHOR_NAME": "Index Lib", "GIT_AUTHOR_EMAIL": "index@example.invalid",
           "GIT_COMMITTER_NAME": "Index Lib", "GIT_COMMITTER_EMAIL": "index@example.invalid",
           "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z",
           "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "HOME": "/nonexistent"}


# -- artifacts -----------------------------------------------------------------------------

def normalize(name):
    """PEP 503's normalised project name."""
    import re
    return re.sub(r"[-_.]+", "-", name).lower()


def _record_hash(data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def build_wheel(name, version, module_text="VALUE = 42\n"):
    """(filename, bytes) of a minimal pure-Python wheel: one module and its .dist-info."""
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    files = [
        (f"{dist}.py", module_text.encode()),
        (f"{info}/METADATA", (f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                              "Summary: a package the egress tests serve\n").encode()),
        (f"{info}/WHEEL", b"Wheel-Version: 1.0\nGenerator: indexlib\nRoot-Is-Purelib: true\n"
                          b"Tag: py3-none-any\n"),
    ]
    record = "".join(f"{path},{_record_hash(data)},{len(data)}\n" for path, data in files)
    record += f"{info}/RECORD,,\n"
    files.append((f"{info}/RECORD", record.encode()))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in files:
            zi = zipfile.ZipInfo(path, date_time=(2026, 1, 1, 0, 0, 0))
            zi.external_attr = 0o644 << 16
            z.writestr(zi, data)
    return f"{dist}-{version}-py3-none-any.whl", buf.getvalue()


def build_npm_tarball(name, version, files=None):
    """Bytes of an npm package tarball: package/package.json (+ files {name: text})."""
    members = {"package.json": json.dumps({"name": name, "version": version,
                                           "description": "a package the egress tests serve",
                                           "main": "index.js", "license": "MIT"}, indent=2) + "\n",
               "index.js": "module.exports = 42;\n"}
    members.update(files or {})
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        for path, text in members.items():
            data = text.encode()
            ti = tarfile.TarInfo(f"package/{path}")
            ti.size, ti.mode, ti.mtime = len(data), 0o644, 1767225600
            t.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def build_bare_repo(workdir, name="repo", files=None):
    """A bare git repository `<workdir>/<name>.git` with one commit of files {path: text},
    ready for dumb HTTP (`git update-server-info`); returns (bare path, commit id)."""
    env = dict(os.environ, **GIT_ENV)
    src = os.path.join(workdir, f"{name}-src")
    bare = os.path.join(workdir, f"{name}.git")
    os.makedirs(src)

    def git(*args, cwd=src):
        return subprocess.run(["git", *args], cwd=cwd, env=env, check=True,
                              capture_output=True, text=True).stdout.strip()

    git("init", "-q", "-b", "main")
    for path, text in (files or {"README": "served over dumb HTTP\n"}).items():
        full = os.path.join(src, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w") as f:
            f.write(text)
    git("add", "-A")
    git("commit", "-q", "-m", "the one commit")
    head = git("rev-parse", "HEAD")
    git("clone", "-q", "--bare", src, bare, cwd=workdir)
    git("update-server-info", cwd=bare)
    return bare, head


# -- the server ----------------------------------------------------------------------------

class Hit:
    __slots__ = ("method", "path", "status", "bytes", "headers", "ts")

    def __init__(self, method, path, status, nbytes, headers):
        self.method, self.path, self.status, self.bytes = method, path, status, nbytes
        self.headers, self.ts = headers, time.time()

    def __repr__(self):
        return f"Hit({self.method} {self.path} -> {self.status}, {self.bytes} B)"


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    server_version = "indexlib/1"

    def log_message(self, *args):      # quiet
        pass

    def _answer(self, head_only):
        index = self.server.index
        status, ctype, body = index.lookup(self.path)
        index._hit(Hit(self.command, self.path, status, 0 if head_only else len(body),
                       [(k, v) for k, v in self.headers.items()]))
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        if not head_only:
            self.wfile.write(body)

    def do_GET(self):
        self._answer(False)

    def do_HEAD(self):
        self._answer(True)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class Index:
    """The servers above on one 127.0.0.1 port. `start()`, then `url`, `hits`, `mark()` /
    `since(mark)`; `stop()` shuts it down (shutdown, join, server_close)."""

    def __init__(self, workdir):
        self.workdir = workdir
        self.routes = {}                    # path without query -> (content type, bytes)
        self.hits = []
        self._lock = threading.Lock()
        self._server = self._thread = None
        self.port = None

    # content
    def add(self, path, body, ctype="application/octet-stream"):
        self.routes[path] = (ctype, body if isinstance(body, bytes) else body.encode())

    def add_pypi(self, name, version, module_text="VALUE = 42\n"):
        """Serve a wheel of `name`; returns (filename, bytes, sha256 hex)."""
        filename, data = build_wheel(name, version, module_text)
        digest = hashlib.sha256(data).hexdigest()
        project = normalize(name)
        self.add(f"/files/{filename}", data)
        page = ("<!DOCTYPE html>\n<html><head><title>Links for {0}</title></head><body>\n"
                "<h1>Links for {0}</h1>\n<a href=\"/files/{1}#sha256={2}\">{1}</a><br/>\n"
                "</body></html>\n").format(project, filename, digest)
        self.add(f"/simple/{project}/", page, "text/html")
        projects = sorted({p.split("/")[2] for p in self.routes if p.startswith("/simple/")
                           and p.count("/") == 3})
        self.add("/simple/", "<!DOCTYPE html>\n<html><body>\n" + "".join(
            f"<a href=\"/simple/{p}/\">{p}</a><br/>\n" for p in projects) + "</body></html>\n",
            "text/html")
        return filename, data, digest

    def add_npm(self, name, version):
        """Serve an npm package; returns (tarball filename, bytes). The packument's tarball
        URL names this server, so call after start()."""
        data = build_npm_tarball(name, version)
        filename = f"{name}-{version}.tgz"
        tar_path = f"/{name}/-/{filename}"
        self.add(tar_path, data)
        integrity = "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()
        manifest = {"name": name, "version": version, "description": "a package the egress tests serve",
                    "main": "index.js", "license": "MIT",
                    "dist": {"tarball": self.url + tar_path, "shasum": hashlib.sha1(data).hexdigest(),
                             "integrity": integrity}}
        packument = {"_id": name, "name": name, "dist-tags": {"latest": version},
                     "versions": {version: manifest},
                     "time": {"created": "2026-01-01T00:00:00.000Z", version: "2026-01-01T00:00:00.000Z",
                              "modified": "2026-01-01T00:00:00.000Z"}}
        self.add(f"/{name}", json.dumps(packument), "application/json")
        return filename, data

    def add_git(self, name="repo", files=None):
        """Serve a bare repository at /<name>.git/ (dumb HTTP); returns its commit id."""
        bare, head = build_bare_repo(self.workdir, name, files)
        for base, _, names in os.walk(bare):
            for n in names:
                full = os.path.join(base, n)
                with open(full, "rb") as f:
                    self.add(f"/{name}.git/" + os.path.relpath(full, bare), f.read(),
                             "text/plain" if n in ("refs", "packs", "HEAD") else
                             "application/octet-stream")
        return head

    # the server
    def lookup(self, raw_path):
        path = raw_path.split("?", 1)[0]
        if path in self.routes:
            ctype, body = self.routes[path]
            return 200, ctype, body
        return 404, "text/plain", b"not found\n"

    def _hit(self, hit):
        with self._lock:
            self.hits.append(hit)

    def start(self):
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.index = self
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="indexlib",
                                        kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def mark(self):
        with self._lock:
            return len(self.hits)

    def since(self, mark):
        with self._lock:
            return list(self.hits[mark:])

    def stop(self):
        if self._server is not None:
            self._server.shutdown()
            self._thread.join(10)
            self._server.server_close()
            self._server = None
