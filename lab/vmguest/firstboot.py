"""First boot of the vMetal OS image: read the NoCloud seed, set up the network, join the tenant, stay Ready.

Runs inside the OS image built by lab/vmimage.py (`python3 /opt/vmetal/firstboot.py`), the way cloud-init and a
kubelet would on a real OS: the seed the agent wrote into the root disk's last 64 MiB is read with the agent's
own reader (agent/seed.py, copied into the image); its network-config (netplan v2, as claims/steps.py
network_config writes it) sets a static address and default route, or DHCP; its user-data's `runcmd` is run in
order, and a join command among them (the vCluster `curl … /node/join?token=… | sh -` line, or `kubeadm join
ENDPOINT --token T --discovery-token-ca-cert-hash sha256:H`) is carried out here over HTTP with the bootstrap
token, as lab/kube.py kubelet_join does: create the Node (a re-join merges its labels), set its status Ready,
then post Ready again every HEARTBEAT_S while the machine is up. Standard library, PyYAML and pycdlib only.
"""
from __future__ import annotations

import base64
import datetime
import hashlib
import json
import logging
import os
import re
import shlex
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

log = logging.getLogger("vmetal-os")

HEARTBEAT_S = 10
SYS_BLOCK = "/sys/block"
SYS_NET = "/sys/class/net"
VCLUSTER_RE = re.compile(r"(https?)://([^/\s\"']+)/node/join\?token=([a-z0-9]{6}\.[a-z0-9]{16})")
CACERT_RE = re.compile(r"echo\s+([A-Za-z0-9+/]+={0,2})\s*\|\s*base64\s+-d\s*\|.*--cacert\s+/dev/stdin")
TOKEN_RE = re.compile(r"^[a-z0-9]{6}\.[a-z0-9]{16}$")


class JoinError(RuntimeError):
    """The join cannot be done: refused token, unreachable API, unreadable command. The message names no secret."""


@dataclass
class JoinSpec:
    mode: str  # vcluster | kubeadm
    scheme: str  # http | https
    endpoint: str  # host:port
    token: str
    ca_pem: str | None = None  # the tenant API's CA (vCluster: from the command; kubeadm: found and pinned)
    ca_hash: str | None = None  # kubeadm: sha256 of the CA's SubjectPublicKeyInfo

    def __repr__(self) -> str:  # the token stays out of logs
        return f"JoinSpec({self.mode} {self.scheme}://{self.endpoint})"


# -- the seed ---------------------------------------------------------------------------------------------------


def find_seed(sys_block: str = SYS_BLOCK, dev_dir: str = "/dev") -> tuple[str, dict] | tuple[None, None]:
    """(disk, seed) of the first whole disk whose last 64 MiB hold a `cidata` ISO; (None, None) when none does."""
    from agent.seed import SeedError, read_seed

    for name in sorted(os.listdir(sys_block)) if os.path.isdir(sys_block) else []:
        if name.startswith(("loop", "ram", "sr", "fd", "dm-")):
            continue
        path = os.path.join(dev_dir, name)
        try:
            return path, read_seed(path)
        except (SeedError, OSError, ValueError) as exc:
            log.info("no seed on %s: %s", path, exc)
    return None, None


# -- the network ------------------------------------------------------------------------------------------------


def nics(sys_net: str = SYS_NET) -> dict[str, str]:
    """{mac: interface} of the machine's NICs (lo and virtual ones left out)."""
    found = {}
    for name in sorted(os.listdir(sys_net)) if os.path.isdir(sys_net) else []:
        if name == "lo" or not os.path.exists(os.path.join(sys_net, name, "device")):
            continue
        try:
            with open(os.path.join(sys_net, name, "address")) as fh:
                found[fh.read().strip().lower()] = name
        except OSError:
            continue
    return found


def network_plan(network_config: str | None, macs: dict[str, str]) -> list[list[str]]:
    """The commands (busybox `ip`, `udhcpc`) that apply a netplan v2 network-config; DHCP on every NIC without one.

    Raises ValueError for a config this image cannot apply (not version 2, a NIC that is not there)."""
    import yaml

    if not network_config or not network_config.strip():
        return [cmd for name in macs.values() for cmd in (["ip", "link", "set", name, "up"], _dhcp(name))]
    config = yaml.safe_load(network_config) or {}
    if isinstance(config.get("network"), dict):
        config = config["network"]
    if config.get("version") != 2:
        raise ValueError(f"network-config version {config.get('version')!r}: this image reads version 2 (netplan)")
    plan: list[list[str]] = []
    for key, nic in (config.get("ethernets") or {}).items():
        mac = ((nic.get("match") or {}).get("macaddress") or "").lower()
        current = macs.get(mac) if mac else key
        if current is None:
            raise ValueError(f"network-config: no NIC with MAC {mac} (have {', '.join(sorted(macs)) or 'none'})")
        name = nic.get("set-name") or current
        if name != current:
            plan.append(["ip", "link", "set", current, "name", name])
        plan.append(["ip", "link", "set", name, "up"])
        if nic.get("dhcp4"):
            plan.append(_dhcp(name))
        for address in nic.get("addresses") or []:
            if ":" not in str(address):  # IPv4 only here
                plan.append(["ip", "addr", "add", str(address), "dev", name])
        gateway = nic.get("gateway4")
        for route in nic.get("routes") or []:
            if route.get("to") in ("default", "0.0.0.0/0"):
                gateway = route.get("via")
        if gateway:
            plan.append(["ip", "route", "add", "default", "via", str(gateway), "dev", name])
    for name in (config.get("vlans") or {}):
        log.warning("network-config: VLAN %s left out (no 802.1Q module in this image)", name)
    return plan


def _dhcp(name: str) -> list[str]:
    return ["udhcpc", "-i", name, "-n", "-q", "-t", "10", "-T", "1", "-s", "/etc/udhcpc.script"]


def nameservers(network_config: str | None) -> list[str]:
    import yaml

    config = (yaml.safe_load(network_config or "") or {}) if network_config else {}
    config = config.get("network", config) if isinstance(config, dict) else {}
    found = []
    for nic in (config.get("ethernets") or {}).values():
        found += [str(a) for a in (nic.get("nameservers") or {}).get("addresses") or []]
    return found


def ipv4_address(interface: str | None = None) -> str | None:
    """The first global IPv4 address (of `interface`, or of any NIC), from `ip -4 -o addr`."""
    argv = ["ip", "-4", "-o", "addr", "show"] + (["dev", interface] if interface else [])
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in out.splitlines():
        words = line.split()
        if "inet" in words and " lo " not in f" {words[1]} ":
            return words[words.index("inet") + 1].split("/")[0]
    return None


# -- the join ---------------------------------------------------------------------------------------------------


def parse_join(command: str) -> JoinSpec | None:
    """The join a runcmd line asks for, or None when the line is not a join."""
    if match := VCLUSTER_RE.search(command):
        scheme, endpoint, token = match.groups()
        ca = None
        if cacert := CACERT_RE.search(command):
            ca = base64.b64decode(cacert.group(1)).decode("ascii", "replace")
        return JoinSpec("vcluster", scheme, endpoint, token, ca_pem=ca)
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    if "kubeadm" in words and "join" in words and "--token" in words:
        try:
            endpoint = words[words.index("join") + 1]
            token = words[words.index("--token") + 1]
            pin = words[words.index("--discovery-token-ca-cert-hash") + 1]
        except (IndexError, ValueError):
            raise JoinError("kubeadm join without an endpoint, --token or --discovery-token-ca-cert-hash") from None
        if not TOKEN_RE.match(token):
            raise JoinError("kubeadm join: not a bootstrap token")
        return JoinSpec("kubeadm", "https", re.sub(r"^https?://", "", endpoint), token,
                        ca_hash=pin.removeprefix("sha256:").lower())
    return None


class TenantClient:
    """Just enough of the Kubernetes API for a joining node, over urllib, authenticated by the bootstrap token."""

    def __init__(self, spec: JoinSpec, timeout: float = 10) -> None:
        self.spec = spec
        self.timeout = timeout
        self.context = None
        self.ready_since: str | None = None
        if spec.scheme == "https":
            if spec.mode == "kubeadm" and spec.ca_pem is None:
                spec.ca_pem = discover_ca(spec, timeout)
            self.context = ssl.create_default_context(cadata=spec.ca_pem) if spec.ca_pem else \
                ssl.create_default_context()

    def request(self, method: str, path: str, body: dict | None = None, *,
                content_type: str = "application/json") -> tuple[int, dict]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"{self.spec.scheme}://{self.spec.endpoint}{path}", data=data, method=method)
        req.add_header("Authorization", f"Bearer {self.spec.token}")
        req.add_header("Accept", "application/json")
        req.add_header("User-Agent", "vmetal-os-firstboot")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=self.context) as resp:
                return resp.status, _json(resp.read())
        except urllib.error.HTTPError as exc:
            answer = _json(exc.read())
            if exc.code == 401:
                raise JoinError(f"tenant API refused the bootstrap token ({answer.get('message') or exc.reason})") \
                    from None
            return exc.code, answer
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise JoinError(f"tenant API {self.spec.endpoint} unreachable: {reason}") from None

    def patch(self, path: str, body: dict) -> dict:
        status, answer = self.request("PATCH", path, body, content_type="application/merge-patch+json")
        if status != 200:
            raise JoinError(f"PATCH {path}: tenant API answered {status}: {answer.get('message', '')}")
        return answer


def _json(raw: bytes) -> dict:
    try:
        value = json.loads(raw or b"{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def discover_ca(spec: JoinSpec, timeout: float) -> str:
    """kubeadm's token discovery: the CA from kube-public/cluster-info, trusted only if its key matches the pin."""
    import yaml

    insecure = ssl.create_default_context()
    insecure.check_hostname = False
    insecure.verify_mode = ssl.CERT_NONE  # what is read is checked against the pinned hash before it is trusted
    url = f"https://{spec.endpoint}/api/v1/namespaces/kube-public/configmaps/cluster-info"
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=insecure) as resp:
            kubeconfig = yaml.safe_load(_json(resp.read()).get("data", {}).get("kubeconfig") or "") or {}
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise JoinError(f"kubeadm discovery: cluster-info unreadable from {spec.endpoint}: {exc}") from None
    clusters = kubeconfig.get("clusters") or [{}]
    data = (clusters[0].get("cluster") or {}).get("certificate-authority-data") or ""
    pem = base64.b64decode(data).decode("ascii", "replace") if data else ""
    if not pem or spki_sha256(pem) != spec.ca_hash:
        raise JoinError("kubeadm discovery: the cluster CA does not match --discovery-token-ca-cert-hash")
    return pem


def spki_sha256(pem: str) -> str:
    """sha256 of a certificate's DER SubjectPublicKeyInfo: what --discovery-token-ca-cert-hash pins."""
    der = ssl.PEM_cert_to_DER_cert(pem)

    def element(buf: bytes, at: int) -> tuple[int, int, int]:  # (tag, start of content, end)
        tag, length, at = buf[at], buf[at + 1], at + 2
        if length & 0x80:
            count = length & 0x7F
            length, at = int.from_bytes(buf[at:at + count], "big"), at + count
        return tag, at, at + length

    _, cert, _ = element(der, 0)
    _, at, _ = element(der, cert)  # tbsCertificate: walk its fields
    fields: list[tuple[int, int] | None] = []
    while len(fields) < 7:  # version, serial, signature, issuer, validity, subject, subjectPublicKeyInfo
        tag, _, end = element(der, at)
        if not fields and tag != 0xA0:
            fields.append(None)  # a v1 certificate: no explicit version
        fields.append((at, end))
        at = end
    key_start, key_end = fields[6]
    return hashlib.sha256(der[key_start:key_end]).hexdigest()


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def ready_condition(since: str | None = None) -> dict:
    """Ready=True, beating now; `since`: when it became Ready (a heartbeat is no transition)."""
    now = _now()
    return {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "vmetal-os is posting ready status",
            "lastHeartbeatTime": now, "lastTransitionTime": since or now}


def machine_capacity(meminfo: str = "/proc/meminfo") -> dict:
    memory = "0"
    try:
        with open(meminfo) as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    memory = f"{line.split()[1]}Ki"
    except OSError:
        pass
    return {"cpu": str(os.cpu_count() or 1), "memory": memory, "pods": "110"}


def join(client: TenantClient, node_name: str, *, address: str | None, labels: dict | None = None,
         capacity: dict | None = None) -> dict:
    """Register the Node with the bootstrap token and set it Ready; returns the Node as the API answered."""
    node_labels = {"kubernetes.io/hostname": node_name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                   **(labels or {})}
    body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node_name, "labels": node_labels}, "spec": {}}
    status, answer = client.request("POST", "/api/v1/nodes", body)
    if status == 409:  # registered before (a reboot): merge the labels
        client.patch(f"/api/v1/nodes/{node_name}", {"metadata": {"labels": node_labels}})
    elif status not in (200, 201):
        raise JoinError(f"creating node {node_name}: tenant API answered {status}: {answer.get('message', '')}")
    resources = capacity or machine_capacity()
    client.ready_since = client.ready_since or _now()
    uname = os.uname()
    addresses = [{"type": "Hostname", "address": node_name}]
    if address:
        addresses.insert(0, {"type": "InternalIP", "address": address})
    return client.patch(f"/api/v1/nodes/{node_name}/status", {"status": {
        "capacity": resources, "allocatable": resources, "addresses": addresses,
        "nodeInfo": {"kubeletVersion": "v1.33.0", "kubeProxyVersion": "", "osImage": "vMetal OS (Debian 12 packages)",
                     "operatingSystem": "linux", "architecture": "amd64", "kernelVersion": uname.release,
                     "containerRuntimeVersion": "", "machineID": "", "systemUUID": "", "bootID": _boot_id()},
        "conditions": [ready_condition(client.ready_since)]}})


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def heartbeat(client: TenantClient, node_name: str, every: float = HEARTBEAT_S, beats: int | None = None) -> None:
    """Post Ready every `every` seconds (forever, or `beats` times); a failed post is logged and tried next time."""
    done = 0
    while beats is None or done < beats:
        time.sleep(every)
        try:
            client.patch(f"/api/v1/nodes/{node_name}/status",
                         {"status": {"conditions": [ready_condition(client.ready_since)]}})
        except JoinError as exc:
            log.warning("heartbeat: %s", exc)
        done += 1


# -- the first boot ---------------------------------------------------------------------------------------------


def run(*, retry_s: float = 5, join_deadline_s: float = 600) -> int:
    import yaml

    disk, seed = find_seed()
    if seed is None:
        log.info("no NoCloud seed on any disk: DHCP on every NIC, nothing to join")
        _apply(network_plan(None, nics()))
        return 0
    log.info("seed found on %s", disk)
    user_data = yaml.safe_load(seed["user-data"] or "") or {}
    meta_data = yaml.safe_load(seed["meta-data"] or "") or {}
    node_name = meta_data.get("local-hostname") or user_data.get("hostname") or os.uname().nodename
    subprocess.run(["hostname", node_name], check=False)
    try:
        plan = network_plan(seed["network-config"], nics())
    except ValueError as exc:
        log.error("%s: DHCP instead", exc)
        plan = network_plan(None, nics())
    _apply(plan)
    if servers := nameservers(seed["network-config"]):
        with open("/etc/resolv.conf", "w") as fh:
            fh.write("".join(f"nameserver {s}\n" for s in servers))
    address = ipv4_address()
    log.info("network up: %s", address or "no IPv4 address")
    joined = None
    for command in user_data.get("runcmd") or []:
        text = command if isinstance(command, str) else shlex.join(str(w) for w in command)
        try:
            spec = parse_join(text)
        except JoinError as exc:
            log.error("runcmd: %s", exc)
            continue
        if spec is None:
            proc = subprocess.run(["sh", "-c", text], check=False)
            log.info("runcmd exited %d", proc.returncode)
            continue
        log.info("joining %s as node %s", spec, node_name)
        joined = _join_until(spec, node_name, address, retry_s, join_deadline_s)
    if joined is None:
        log.info("no join command in the seed's runcmd: done")
        return 0
    print(f"vmetal-os: node {node_name} joined {joined.spec.endpoint}, Ready ({_uptime()} s after boot)", flush=True)
    heartbeat(joined, node_name)
    return 0


def _join_until(spec: JoinSpec, node_name: str, address: str | None, retry_s: float,
                deadline_s: float) -> TenantClient | None:
    """Join, retrying while the API is unreachable (the network may still be coming up); a refused token is final."""
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            client = TenantClient(spec)
            join(client, node_name, address=address)
            return client
        except JoinError as exc:
            final = "refused" in str(exc) or time.monotonic() > deadline
            log.error("join: %s%s", exc, "" if final else f"; again in {retry_s:.0f} s")
            if final:
                print(f"vmetal-os: join failed: {exc}", flush=True)
                return None
            time.sleep(retry_s)


def _uptime() -> str:
    try:
        with open("/proc/uptime") as fh:
            return fh.read().split()[0]
    except OSError:
        return "?"


def _apply(plan: list[list[str]]) -> None:
    for argv in plan:
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        log.info("%s: exit %d%s", " ".join(argv), proc.returncode,
                 f" ({(proc.stderr or proc.stdout).strip()})" if proc.returncode else "")


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="vmetal-os %(asctime)s %(levelname)s %(message)s", stream=sys.stdout)
    return run()


if __name__ == "__main__":
    sys.exit(main())
