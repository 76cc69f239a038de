"""Writes python/requirements.lock from python/requirements.in: every package pip resolves for
this machine (Linux x86_64, the Python that runs this script), each with its exact version and
the sha256 of the file pip would fetch, for `pip install --require-hashes`.

    python3 python/lock.py           # rewrite the lock
    python3 python/lock.py --check   # exit 1 if the lock is not what requirements.in resolves to
"""
import json
import pathlib
import subprocess
import sys
import tempfile

here = pathlib.Path(__file__).resolve().parent
wanted = here / "requirements.in"
lock = here / "requirements.lock"


def resolve():
    with tempfile.TemporaryDirectory() as tmp:
        report = pathlib.Path(tmp) / "report.json"
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--dry-run",
                        "--ignore-installed", "--only-binary=:all:", "--report", str(report),
                        "-r", str(wanted)], check=True)
        items = json.loads(report.read_text())["install"]
    lines = []
    for item in sorted(items, key=lambda i: i["metadata"]["name"].lower()):
        name, version = item["metadata"]["name"], item["metadata"]["version"]
        digest = item["download_info"]["archive_info"]["hashes"]["sha256"]
        lines.append(f"{name}=={version} \\\n    --hash=sha256:{digest}")
    head = (f"# Made by python/lock.py from requirements.in for Python "
            f"{sys.version_info.major}.{sys.version_info.minor} on Linux x86_64; do not edit.\n")
    return head + "\n".join(lines) + "\n"


def main():
    text = resolve()
    if "--check" in sys.argv[1:]:
        same = lock.exists() and lock.read_text() == text
        print(f"lock: {lock.name} {'matches' if same else 'differs from'} {wanted.name}")
        sys.exit(0 if same else 1)
    lock.write_text(text)
    print(f"lock: wrote {lock} ({text.count('==')} packages)")


if __name__ == "__main__":
    main()
