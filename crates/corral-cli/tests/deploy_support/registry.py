"""A local package registry for tests/deploy.rs, on 127.0.0.1 only.

usage: registry.py ROOT SPEC_JSON

Builds, under ROOT, a PEP 503 "simple" Python index of wheels (written
here: a wheel is a zip with METADATA, WHEEL and RECORD) and a static npm
registry (a packument per package with dist.tarball and dist.integrity),
binds 127.0.0.1 on a free port, prints "PORT <n>" and serves until killed.
Every request path is appended to ROOT/requests.log.

SPEC: {"host": NAME the clients use,
       "token": T (optional: every request must carry `Bearer T` or basic
                   auth with password T, else 401; requests.log marks the
                   authorised ones "AUTH "),
       "tls": {"cert": PEM, "key": PEM} (optional: serve HTTPS),
       "wheels": [{"name", "version", "files": {path: text},
                   "requires": [..], "entry_points": {name: "mod:fn"}}],
       "npm": [{"name", "version", "files": {path: text}, "package": {..}}]}
"""
import base64
import hashlib
import ssl
import http.server
import io
import json
import os
import sys
import tarfile
import zipfile

root, spec = sys.argv[1], json.loads(sys.argv[2])
host = spec.get("host", "registry.test")
token = spec.get("token")
scheme = "https" if spec.get("tls") else "http"


def norm(name):
    return name.lower().replace("_", "-").replace(".", "-")


def write_wheel(w):
    dist = w["name"].replace("-", "_")
    ver = w["version"]
    info = f"{dist}-{ver}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {w['name']}\nVersion: {ver}\n"
    for r in w.get("requires", []):
        meta += f"Requires-Dist: {r}\n"
    files = {p: t.encode() for p, t in w.get("files", {}).items()}
    files[f"{info}/METADATA"] = meta.encode()
    files[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: corral-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    if w.get("entry_points"):
        eps = "[console_scripts]\n" + "".join(f"{k} = {v}\n" for k, v in w["entry_points"].items())
        files[f"{info}/entry_points.txt"] = eps.encode()
    rec = []
    d = os.path.join(root, "simple", norm(w["name"]))
    os.makedirs(d, exist_ok=True)
    fname = f"{dist}-{ver}-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(d, fname), "w") as z:
        for n, data in files.items():
            z.writestr(n, data)
            h = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            rec.append(f"{n},sha256={h},{len(data)}")
        rec.append(f"{info}/RECORD,,")
        z.writestr(f"{info}/RECORD", "\n".join(rec) + "\n")
    with open(os.path.join(d, "index.html"), "a") as f:
        f.write(f'<a href="{fname}">{fname}</a>\n')
    return norm(w["name"])


def write_npm(p, port):
    name, ver = p["name"], p["version"]
    pkg = {"name": name, "version": ver, "main": "index.js"}
    pkg.update(p.get("package", {}))
    files = dict(p.get("files", {}))
    files["package.json"] = json.dumps(pkg)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        for path, text in sorted(files.items()):
            data = text.encode()
            ti = tarfile.TarInfo("package/" + path)
            ti.size = len(data)
            ti.mode = 0o644
            ti.mtime = 1700000000
            t.addfile(ti, io.BytesIO(data))
    tgz = buf.getvalue()
    d = os.path.join(root, "npm", name)
    os.makedirs(os.path.join(d, "-"), exist_ok=True)
    # A scoped name's tarball is named after its last part, as npm's are.
    fname = f"{name.rsplit('/', 1)[-1]}-{ver}.tgz"
    with open(os.path.join(d, "-", fname), "wb") as f:
        f.write(tgz)
    integrity = "sha512-" + base64.b64encode(hashlib.sha512(tgz).digest()).decode()
    version = dict(pkg)
    version["dist"] = {
        "tarball": f"{scheme}://{host}:{port}/npm/{name}/-/{fname}",
        "integrity": integrity,
        "shasum": hashlib.sha1(tgz).hexdigest(),
    }
    doc = {"name": name, "dist-tags": {"latest": ver}, "versions": {ver: version}}
    with open(os.path.join(d, "index.json"), "w") as f:
        json.dump(doc, f)


def authorised(header):
    if not token:
        return True
    if header == f"Bearer {token}":
        return True
    if header and header.startswith("Basic "):
        try:
            user_pass = base64.b64decode(header[6:]).decode()
        except ValueError:
            return False
        return user_pass.split(":", 1)[-1] == token
    return False


class Handler(http.server.SimpleHTTPRequestHandler):
    def do_GET(self):
        if not authorised(self.headers.get("Authorization")):
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="registry"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.authed = bool(token)
        super().do_GET()

    def translate_path(self, path):
        p = path.split("?", 1)[0]
        if p.startswith("/npm/") and "/-/" not in p:
            p = p.rstrip("/") + "/index.json"
        return super().translate_path(p)

    def guess_type(self, path):
        if path.endswith(".json"):
            return "application/json"
        return super().guess_type(path)

    def log_message(self, fmt, *args):
        with open(os.path.join(root, "requests.log"), "a") as f:
            f.write(("AUTH " if getattr(self, "authed", False) else "") + self.path + "\n")


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), lambda *a, **k: Handler(*a, directory=root, **k))
port = server.server_address[1]
if spec.get("tls"):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(spec["tls"]["cert"], spec["tls"]["key"])
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
names = sorted({write_wheel(w) for w in spec.get("wheels", [])})
os.makedirs(os.path.join(root, "simple"), exist_ok=True)
with open(os.path.join(root, "simple", "index.html"), "w") as f:
    f.write("".join(f'<a href="{n}/">{n}</a>\n' for n in names))
for p in spec.get("npm", []):
    write_npm(p, port)
print(f"PORT {port}", flush=True)
server.serve_forever()
