#!/usr/bin/env python3
"""Runs the chart's rendered backup CronJob and restore Job against real `lathe` servers (run by
validate.sh).

    backup_recipe_smoke.py RENDERED.yaml...

For every render with a `*-backup` CronJob (helm-all-features.yaml: backup.enabled and
backup.restore.file set), the shell scripts of the CronJob and of the `*-restore` Job run as
rendered, with /bin/sh, `lathe` on PATH and the Jobs' environment: LATHE_ADDR, LATHE_API_KEY (the
Jobs read it from a Secret; here a read-write key the server is given) and LATHE_CA_CERT. Only
what a pod has and this machine has not is moved: `/backups` (the backup volume) becomes a
temporary folder, and LATHE_ADDR points at a loopback `lathe serve` without TLS (so LATHE_CA_CERT
is dropped: the chart's TLS is covered by tests/tls.rs and the schema checks, not here).
  * backup: a server holds a collection `docs` ingested with `lathe ingest`; the CronJob's script
    downloads a `docs-g*.snapshot` into the folder, and run keep+1 times (`--keep N` of the
    script) leaves N snapshots on the server; with older copies on the volume, a run keeps the
    newest `keepDownloaded` of each collection there and leaves other collections' copies alone;
  * restore: on a second, empty server, the restore Job's script, its file name replaced by a
    downloaded copy, creates its collection, and `lathe query` finds the documents in it.
The binary is $LATHE_BIN, else debug/lathe, else release/lathe under $CARGO_TARGET_DIR (default
target/); without one, or without models/, the step is skipped with a NOTICE (exit 0). Exit
status 1 on any failure.
"""

from __future__ import annotations

import json
import os
import queue
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
START_SECONDS = 120
RUN_SECONDS = 120
DOCUMENTS = {
    "kettle.md": "# Kettles\n\nA kettle boils water for tea. The descaling of a kettle uses citric acid.\n",
    "lighthouse.md": "# Lighthouses\n\nA lighthouse keeper trims the lamp wick every evening before dusk.\n",
}


class Failure(Exception):
    """One check that did not hold; its message says which."""


class Server:
    """`lathe serve` on a loopback port 0 listener, its JSON log read on a thread."""

    def __init__(self, binary: Path, data_dir: Path, keys_file: Path, log_path: Path) -> None:
        env = {**os.environ, "LATHE_MODELS__DENSE": "off", "LATHE_AUTH__API_KEYS_FILE": str(keys_file),
               "LATHE_LOG__FILTER": "info", "LATHE_SERVER__CPU_THREADS": "2",
               "LATHE_STORAGE__WRITER_MEMORY_BYTES": "16000000"}
        self.log_path = log_path
        self.process = subprocess.Popen(
            [str(binary), "serve", "--listen", "127.0.0.1:0", "--models-dir", str(REPO / "models"),
             "--data-dir", str(data_dir), "--log-format", "json"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read_log, args=(lines,), daemon=True).start()
        try:
            self.address = self._wait_serving(lines)
        except Failure:
            self.process.kill()
            self.process.wait()
            raise

    def _read_log(self, lines: queue.Queue) -> None:
        with open(self.log_path, "w") as log:
            for line in self.process.stderr:
                log.write(line)
                log.flush()
                lines.put(line)
        lines.put(None)

    def _wait_serving(self, lines: queue.Queue) -> str:
        deadline = time.monotonic() + START_SECONDS
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = lines.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                raise Failure(f"lathe serve exited with {self.process.wait()} before serving")
            if "lathe serving" in line:
                return json.loads(line)["fields"]["address"]
        raise Failure(f"lathe serve did not log `lathe serving` within {START_SECONDS} s")

    def stop(self) -> None:
        """SIGTERM and a clean exit: every collection committed."""
        if self.process.poll() is None:
            self.process.terminate()
        try:
            status = self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise Failure("lathe serve did not exit within 60 s of SIGTERM")
        if status != 0:
            raise Failure(f"lathe serve exited with {status} after SIGTERM")


def find(documents: list[dict], kind: str, suffix: str) -> dict | None:
    return next((d for d in documents if d["kind"] == kind and d["metadata"]["name"].endswith(suffix)), None)


def script_and_env(pod: dict, what: str) -> tuple[str, dict[str, dict]]:
    """The container's shell script (`/bin/sh -ec` and args[0]) and its env by name."""
    [container] = pod["containers"]
    if container.get("command") != ["/bin/sh", "-ec"] or len(container.get("args") or []) != 1:
        raise Failure(f"{what}: expected command /bin/sh -ec and one script in args")
    env = {variable["name"]: variable for variable in container.get("env") or []}
    if "LATHE_ADDR" not in env:
        raise Failure(f"{what}: no LATHE_ADDR in the container's env")
    if "secretKeyRef" not in (env.get("LATHE_API_KEY", {}).get("valueFrom") or {}):
        raise Failure(f"{what}: LATHE_API_KEY is not read from a Secret (secretKeyRef)")
    return container["args"][0], env


def job_env(env: dict[str, dict], binary: Path, address: str, api_key: str) -> dict[str, str]:
    """The Job's environment on this machine: the rendered plain values, the Secret's key, the
    loopback address without TLS, and `lathe` first on PATH."""
    values = {name: v["value"] for name, v in env.items() if "value" in v}
    values.pop("LATHE_CA_CERT", None)  # TLS is off here (see the module doc)
    values.update(LATHE_ADDR=f"http://{address}", LATHE_API_KEY=api_key)
    path = f"{binary.parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return {**os.environ, **values, "PATH": path}


def run(command: list[str], env: dict[str, str], what: str) -> str:
    """Runs `command` to its end; its stdout, or a Failure with its output."""
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=RUN_SECONDS)
    except subprocess.TimeoutExpired:
        raise Failure(f"{what}: still running after {RUN_SECONDS} s")
    if done.returncode != 0:
        raise Failure(f"{what} exited with {done.returncode}:\n{done.stdout}{done.stderr}".rstrip())
    return done.stdout


def snapshots_on_server(binary: Path, env: dict[str, str], collection: str) -> list[str]:
    listed = run([str(binary), "snapshot", "--addr", env["LATHE_ADDR"], "list", collection], env,
                 "lathe snapshot list")
    return [line for line in listed.splitlines() if line.strip()]


def check_backup(binary: Path, script: str, env: dict[str, str], folder: Path) -> list[Path]:
    """Runs the CronJob's script keep+1 times and once more with older copies on the volume; the
    copies it downloaded, newest last."""
    keep_match = re.search(r"--keep (\d+)", script)
    downloaded_match = re.search(r"tail -n \+(\d+)", script)
    if not keep_match or not downloaded_match:
        raise Failure("backup script: no `--keep N` or `tail -n +K` (the copies kept) to check against")
    keep, keep_downloaded = int(keep_match[1]), int(downloaded_match[1]) - 1
    local = script.replace("/backups", str(folder))
    ours: list[Path] = []
    for attempt in range(keep + 1):
        run(["/bin/sh", "-ec", local], env, f"backup script (run {attempt + 1})")
        new = sorted(set(folder.glob("docs-g*.snapshot")) - set(ours))
        if len(new) != 1:
            raise Failure(f"backup run {attempt + 1}: {len(new)} new docs-g*.snapshot files in the folder, want 1")
        ours += new
    on_server = snapshots_on_server(binary, env, "docs")
    if len(on_server) != keep:
        raise Failure(f"after {keep + 1} backup runs the server keeps {len(on_server)} snapshots of docs, "
                      f"want --keep {keep}:\n" + "\n".join(on_server))
    # Older copies on the volume: the next run keeps the newest keep_downloaded of docs.
    day_ago = time.time() - 86400
    older = [folder / f"docs-g1-{1000 + i}.snapshot" for i in range(keep_downloaded)]
    other = folder / "other-g1-1000.snapshot"
    for index, path in enumerate(older + [other]):
        path.write_bytes(b"an older copy")
        os.utime(path, (day_ago + index, day_ago + index))
    run(["/bin/sh", "-ec", local], env, "backup script (with older copies on the volume)")
    ours += sorted(set(folder.glob("docs-g*.snapshot")) - set(ours) - set(older))
    left = set(folder.glob("docs-g*.snapshot"))
    if len(left) != keep_downloaded or not set(ours) <= left or not other.exists():
        raise Failure(f"with {keep_downloaded} older copies of docs on the volume, a run left "
                      f"{sorted(p.name for p in left)}; want the newest {keep_downloaded} (all "
                      f"{len(ours)} downloaded now among them) and {other.name} untouched")
    return ours


def check_restore(binary: Path, script: str, env: dict[str, str], copy: Path) -> str:
    """Runs the restore Job's script on copy; the collection it restored into."""
    file_match = re.search(r"/backups/(\S+\.snapshot)", script)
    if not file_match:
        raise Failure("restore script: no /backups/<file>.snapshot to restore")
    collection_match = re.search(r"--collection (\S+)", script)
    collection = collection_match[1] if collection_match else copy.name.rsplit("-g", 1)[0]
    if script.count("/backups") != 1:
        raise Failure("restore script: names /backups other than its file")
    local = script.replace(file_match[0], str(copy))
    print(run(["/bin/sh", "-ec", local], env, "restore script").strip())
    answer = run([str(binary), "query", "--collection", collection, "--addr", env["LATHE_ADDR"], "--json",
                  "how do I descale a kettle and who trims the lighthouse lamp wick"], env, "lathe query")
    found = {Path(chunk["docId"]).name for chunk in json.loads(answer)["chunks"]}
    if found != set(DOCUMENTS):
        raise Failure(f"lathe query on the restored `{collection}` found {sorted(found)}, want {sorted(DOCUMENTS)}")
    return collection


def smoke(binary: Path, path: Path, folder: Path) -> str | None:
    """One render's backup and restore, run; a summary, or None without a backup CronJob."""
    documents = [d for d in yaml.safe_load_all(path.read_text()) if d]
    cronjob, restore_job = find(documents, "CronJob", "-backup"), find(documents, "Job", "-restore")
    if cronjob is None:
        return None
    if restore_job is None:
        raise Failure("a backup CronJob but no restore Job (set backup.restore.file in the values)")
    backup_script, backup_env = script_and_env(
        cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"], "backup CronJob")
    restore_script, restore_env = script_and_env(restore_job["spec"]["template"]["spec"], "restore Job")
    api_key = secrets.token_hex(16)
    keys_file = folder / "api-keys"
    keys_file.write_text(f"read-write {api_key}\n")
    backups, docs = folder / "backups", folder / "docs"
    backups.mkdir()
    docs.mkdir()
    for name, text in DOCUMENTS.items():
        (docs / name).write_text(text)
    server = Server(binary, folder / "data-1", keys_file, folder / "server-1.log")
    try:
        env = job_env(backup_env, binary, server.address, api_key)
        run([str(binary), "ingest", "--collection", "docs", "--addr", env["LATHE_ADDR"], str(docs)], env,
            "lathe ingest")
        copies = check_backup(binary, backup_script, env, backups)
    finally:
        server.stop()
    server = Server(binary, folder / "data-2", keys_file, folder / "server-2.log")
    try:
        env = job_env(restore_env, binary, server.address, api_key)
        restored = check_restore(binary, restore_script, env, copies[-1])
    finally:
        server.stop()
    return (f"{path.name}: the backup CronJob's script ran {len(copies)} times (snapshots kept on the "
            f"server and copies on the volume pruned as rendered); the restore Job's script made "
            f"`{restored}` from {copies[-1].name} on a second server, and lathe query finds its documents")


def lathe_binary() -> Path | None:
    target = Path(os.environ.get("CARGO_TARGET_DIR") or REPO / "target")
    for candidate in (os.environ.get("LATHE_BIN"), target / "debug/lathe", target / "release/lathe"):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return Path(candidate).resolve()
    return None


def main(paths: list[str]) -> int:
    binary = lathe_binary()
    if binary is None or not (REPO / "models").is_dir():
        print("NOTICE: no lathe binary ($LATHE_BIN, or debug/lathe or release/lathe under $CARGO_TARGET_DIR "
              "or target/) or no models/ folder: the rendered backup and restore scripts were not run")
        return 0
    problems, runs = [], 0
    for path in map(Path, paths):
        folder = Path(tempfile.mkdtemp(prefix="backup-smoke-"))
        try:
            summary = smoke(binary, path, folder)
            if summary is not None:
                runs += 1
                print(summary)
        except (Failure, OSError, KeyError, ValueError, subprocess.SubprocessError) as error:
            problems.append(f"{path.name}: {error}")
            for log in sorted(folder.glob("server-*.log")):
                tail = log.read_text().splitlines()[-5:]
                problems.append(f"{path.name}: {log.name} ends:\n    " + "\n    ".join(tail))
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    if runs == 0 and not problems:
        problems.append("no render has a backup CronJob (ci/all-features-values.yaml switches it on)")
    for problem in problems:
        print(f"FAIL {problem}", file=sys.stderr)
    print(f"backup: {runs} rendered backup and restore recipes run with {binary}"
          + (f", {len(problems)} problems" if problems else ""))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
