"""Runs OpenTofu for one workspace: the template (inline, or from git through a cache per repository), a backend
override pointing at the console's state backend, the inputs as `var.vcluster`, the provider's credentials, then
TOFU_BINARY with a deadline. Secrets travel in the environment and in a 0600 file removed after the run, never in
argv, logs or messages."""
import contextlib
import fcntl
import hashlib
import io
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings

log = logging.getLogger(__name__)


class TofuFailed(Exception):
    """A run that did not finish: a message for people, scrubbed of secrets; `retry` False when waiting will not
    help (the configuration is wrong)."""

    def __init__(self, message: str, *, retry: bool = True):
        super().__init__(message)
        self.message = message
        self.retry = retry


BACKEND_FILE = "zz_vmetal_backend_override.tf"  # an override file: it replaces any backend the template names
VARS_FILE = "zz_vmetal.auto.tfvars.json"
KEEP = {".terraform", ".terraform.lock.hcl"}  # kept between runs: the providers init downloaded
DEFAULT_FETCH_INTERVAL_S = 600  # vCluster's default for git templates: 10 minutes
STDERR_TAIL = 2000
SENSITIVE = "(sensitive)"
DURATION = re.compile(r"(\d+(?:\.\d+)?)(h|m|s|ms)")


def duration_s(value, default: float) -> float:
    """A Go duration as vCluster's fields write them ("10m", "1h30m", "90s"), or a number of seconds."""
    if value in (None, ""):
        return default
    if isinstance(value, (int, float)):
        return float(value)
    text = str(value).strip()
    parts = DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise TofuFailed(f"{value!r} is not a duration (such as 90s, 10m, 1h30m)", retry=False)
    scale = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    return sum(float(n) * scale[u] for n, u in parts)


@dataclass
class Run:
    """One workspace's run: what the runner needs, secrets included (kept out of every message)."""
    workspace: str
    template: dict  # nodeTemplate: {"inline": "..."} or {"git": {...}}
    variables: dict  # {"vcluster": {...}}
    password: str  # the state backend's, for this run
    env: dict = field(default_factory=dict)  # the provider's credentials
    timeout_s: float = 3600

    def secrets(self) -> list[str]:
        found = [self.password, *self.env.values()]
        user_data = (self.variables.get("vcluster") or {}).get("userData")
        if user_data:
            found += [user_data, *[line for line in user_data.splitlines() if len(line.strip()) >= 8]]
        return sorted({s for s in found if s and len(s) >= 6}, key=len, reverse=True)

    def scrub(self, text: str) -> str:
        for secret in self.secrets():
            text = text.replace(secret, "********")
        return text


def workdir() -> Path:
    return Path(settings.TOFU_WORKDIR)


WORKSPACE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")


def workspace_dir(workspace: str) -> Path:
    if not WORKSPACE_NAME.fullmatch(workspace):  # a directory's name, and the state backend's URL
        raise TofuFailed(f"{workspace!r} cannot name a workspace", retry=False)
    return workdir() / "workspaces" / workspace


def _run(argv: list[str], *, cwd: Path, env: dict, timeout_s: float, run: Run | None = None,
         what: str = "") -> subprocess.CompletedProcess:
    """One command with what is left of its run's time; on timeout its whole process group is killed."""
    log.info("running %s in %s", " ".join(argv), cwd)
    try:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
    except OSError as exc:  # no such binary (TOFU_BINARY), not executable
        raise TofuFailed(f"{what or argv[1]}: cannot run {argv[0]}: {exc.strerror}", retry=False) from None
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        limit = run.timeout_s if run else timeout_s
        raise TofuFailed(f"{what or argv[1]} killed: the run did not finish within {limit:g} s") from None
    if proc.returncode != 0:
        said = (err or out or "").strip()
        tail = (run.scrub(said) if run else said)[-STDERR_TAIL:]  # scrubbed whole: no half secret at the cut
        raise TofuFailed(f"{what or argv[1]} failed (exit {proc.returncode}): {tail}")
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


# -- the template ----------------------------------------------------------------------------------

def _git_env() -> dict:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(workdir()), "GIT_TERMINAL_PROMPT": "0"}


def git_template(git: dict, into: Path, timeout_s: float) -> str:
    """Extract `git`'s subPath at its branch, tag or commit into `into`; returns the commit used. The repository
    is mirrored once per URL under TOFU_WORKDIR/git and fetched again only after fetchInterval."""
    repository = git.get("repository")
    if not repository:
        raise TofuFailed("nodeTemplate.git needs a repository", retry=False)
    cache = workdir() / "git" / hashlib.sha256(repository.encode()).hexdigest()[:24]
    cache.parent.mkdir(parents=True, exist_ok=True)
    interval = duration_s(git.get("fetchInterval"), DEFAULT_FETCH_INTERVAL_S)
    stamp = cache.parent / f"{cache.name}.fetched"
    env = _git_env()
    with open(cache.parent / f"{cache.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one clone or fetch per repository at a time, across workers
        if not (cache / "HEAD").exists():
            shutil.rmtree(cache, ignore_errors=True)
            _run(["git", "clone", "--quiet", "--mirror", "--", repository, str(cache)], cwd=cache.parent, env=env,
                 timeout_s=timeout_s, what="git clone")
            stamp.write_text(str(time.time()))
        elif time.time() - (float(stamp.read_text()) if stamp.exists() else 0.0) >= interval:
            _run(["git", "--git-dir", str(cache), "fetch", "--quiet", "--prune", "--tags", "--force", "origin"],
                 cwd=cache.parent, env=env, timeout_s=timeout_s, what="git fetch")
            stamp.write_text(str(time.time()))
        ref = (git.get("commit") or (f"refs/tags/{git['tag']}" if git.get("tag") else None)
               or (f"refs/heads/{git['branch']}" if git.get("branch") else "HEAD"))
        found = subprocess.run(["git", "--git-dir", str(cache), "rev-parse", "--verify", "--quiet",
                                f"{ref}^{{commit}}"], cwd=cache.parent, env=env, capture_output=True, text=True,
                               timeout=60)
        if found.returncode != 0:
            raise TofuFailed(f"git: no {ref} in {repository}", retry=False)
        commit = found.stdout.strip()
        sub = str(git.get("subPath") or "").strip("/")
        tree = f"{commit}:{sub}" if sub else commit
        archive = subprocess.run(["git", "--git-dir", str(cache), "archive", "--format=tar", tree],
                                 cwd=cache.parent, env=env, capture_output=True, timeout=timeout_s)
    if archive.returncode != 0:
        raise TofuFailed(f"git: no {sub or '/'} in {repository} at {commit[:12]}", retry=False)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    return commit


def _prepare(run: Run) -> Path:
    """The workspace's directory with the template, the backend override and nothing of an earlier run but the
    providers init fetched."""
    directory = workspace_dir(run.workspace)
    directory.mkdir(parents=True, exist_ok=True)
    for entry in directory.iterdir():
        if entry.name not in KEEP:
            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    template = run.template if isinstance(run.template, dict) else {"inline": run.template}
    if template.get("git"):
        git_template(template["git"], directory, run.timeout_s)
    elif template.get("inline"):
        (directory / "main.tf").write_text(str(template["inline"]))
    else:
        raise TofuFailed("the provider has no nodeTemplate (inline or git)", retry=False)
    address = f"{settings.TOFU_STATE_URL.rstrip('/')}/{run.workspace}"
    (directory / BACKEND_FILE).write_text(
        "# Written by the console: the state lives in its HTTP backend; credentials come from TF_HTTP_USERNAME and\n"
        "# TF_HTTP_PASSWORD.\n"
        "terraform {\n"
        '  backend "http" {\n'
        f'    address        = "{address}"\n'
        f'    lock_address   = "{address}"\n'
        f'    unlock_address = "{address}"\n'
        '    lock_method    = "LOCK"\n'
        '    unlock_method  = "UNLOCK"\n'
        "  }\n"
        "}\n")
    return directory


def _env(run: Run) -> dict:
    """OpenTofu's environment: the provider's credentials and the backend's, and no more of the console's own
    (its database URL and keys stay out of every template's reach)."""
    env = {k: v for k, v in os.environ.items()
           if k in {"PATH", "LANG", "LC_ALL", "TZ", "SSL_CERT_FILE", "SSL_CERT_DIR"}
           or k.lower() in {"http_proxy", "https_proxy", "no_proxy"}}
    plugins = workdir() / "plugin-cache"
    plugins.mkdir(parents=True, exist_ok=True)
    env.update(run.env)
    env.update(HOME=str(workdir()), TF_IN_AUTOMATION="1", TF_INPUT="0", TF_PLUGIN_CACHE_DIR=str(plugins),
               TF_HTTP_USERNAME=run.workspace, TF_HTTP_PASSWORD=run.password)
    return env


def tofu(run: Run, action: str) -> dict:
    """init, then `apply` or `destroy`; returns the workspace's outputs after an apply ({name: value})."""
    directory = _prepare(run)
    variables = directory / VARS_FILE
    fd = os.open(variables, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # userData is a secret
    with os.fdopen(fd, "w") as out:
        json.dump(run.variables, out)
    env, binary = _env(run), settings.TOFU_BINARY
    deadline = time.monotonic() + run.timeout_s

    def left() -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TofuFailed(f"OpenTofu did not finish within {int(run.timeout_s)} s")
        return remaining

    try:
        _run([binary, "init", "-input=false", "-reconfigure", "-no-color"], cwd=directory, env=env,
             timeout_s=left(), run=run, what="tofu init")
        _run([binary, action, "-auto-approve", "-input=false", "-no-color"], cwd=directory, env=env,
             timeout_s=left(), run=run, what=f"tofu {action}")
        if action != "apply":
            return {}
        out = _run([binary, "output", "-json", "-no-color"], cwd=directory, env=env, timeout_s=left(), run=run,
                   what="tofu output").stdout
    finally:
        variables.unlink(missing_ok=True)
    try:
        # A sensitive output (a password, a kubeconfig) is named, never kept: outputs are shown on the claim.
        return {name: SENSITIVE if o.get("sensitive") else o.get("value")
                for name, o in json.loads(out or "{}").items()}
    except (ValueError, AttributeError):
        raise TofuFailed("tofu output -json answered no JSON") from None


def forget(workspace: str) -> None:
    """The workspace's directory, once its machine is destroyed."""
    shutil.rmtree(workspace_dir(workspace), ignore_errors=True)
