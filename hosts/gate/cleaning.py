"""The release gate's console side: the policy and health suite of a host, the canary key, the verdict on
what the agent read back, and the records it leaves."""
# The release gate's console side: which policy and health suite apply to a host, the per-erase canary key,
# judging what the agent read back, and the records it leaves (EraseCertificate, HealthCheckRun).
#
# The agent erases and reads back (agent/sanitize.py, agent/verify.py); the console decides. It never takes
# the agent's `passed` on trust: it recounts the canaries and samples it reports, and a disk without a
# verification record is a failed disk. Nor does it take the agent's list of disks: which disks there are is the
# census's (hosts/gate/census.py), fixed before the erase.
from __future__ import annotations

import uuid

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.crypto import salted_hmac
from django.utils.dateparse import parse_datetime

from agent import __version__ as agent_version
from events.choices import ObjectType
from events.models import Event
from pools.choices import CleaningPolicy
from pools.gpu import node_type_gpu
from pools.health_tiers import node_type_tiers
from pools.matching import label_selector_matches
from pools.models import NodeType, Tenant

from hosts.gate import certificates
from hosts.gate.archive import certificates_archive_on_commit
from hosts.gate.census import census_match
from hosts.gate.plan import METHOD_WORDS, plan_findings, planned_for
from hosts.models import BareMetalHost, EraseCertificate, HealthCheckRun

STRENGTH = {CleaningPolicy.METADATA: 0, CleaningPolicy.FULL: 1, CleaningPolicy.SECURE: 2}
GPU_RESOURCE = "nvidia.com/gpu"
MEDIA = {"nvme": "NVMe SSD", "ssd": "SATA/SAS SSD", "hdd": "hard disk"}


def node_type_for(host: BareMetalHost, claim=None, types=None):
    """The claim's NodeType, else the one the host's labels select (the strictest cleaning when several do).
    `types`: every NodeType, when the caller has read them already (a list of hosts reads them once)."""
    if claim is not None and claim.node_type_id:
        return claim.node_type
    matching = [t for t in (NodeType.objects.all() if types is None else types) if t.host_selector and
                label_selector_matches(t.host_selector, host.labels or {})]
    if not matching:
        return None
    return max(matching, key=lambda t: (STRENGTH.get(t.cleaning_policy, 1), t.health_dcgm_level,
                                        t.health_nccl_min_busbw_gbps or 0, t.name))


def gpu_count(inventory: dict | None) -> int:
    """GPUs in an inventory: the agent lists them; a Metal3 status imported by `apply` may give a count."""
    gpus = (inventory or {}).get("gpus")
    if isinstance(gpus, list):
        return len([g for g in gpus if isinstance(g, dict)])
    return gpus if isinstance(gpus, int) and not isinstance(gpus, bool) and gpus > 0 else 0


def effective_cleaning(host: BareMetalHost, claim=None, node_type=None) -> dict:
    """The one rule for the cleaning a host gets at its next release, used by the gate, the API and the host page:
    the host's own override, else its NodeType's (node_type_for), else the site's default. {"method",
    "fallback", "source", "node_type", "overrides"}: `overrides` is Metal3's automatedCleaningMode on the host
    when it is not what is applied (the console always erases and verifies; "metadata" or "disabled" there is
    a Metal3 setting this gate does not follow). Pass `node_type` when it is already known."""
    if node_type is None:
        node_type = node_type_for(host, claim)
    if host.cleaning_policy:
        method, source = host.cleaning_policy, "host override"
    elif node_type is not None:
        method, source = node_type.cleaning_policy, f"NodeType {node_type.name}"
    else:
        method, source = settings.CLEANING_DEFAULT_POLICY, "settings.CLEANING_DEFAULT_POLICY"
    mode = host.automated_cleaning_mode or ""
    return {"method": method, "fallback": node_type.cleaning_fallback if node_type else "", "source": source,
            "node_type": node_type.name if node_type else "", "overrides": mode if mode and mode != method else ""}


def gate_for(host: BareMetalHost, claim=None) -> dict:
    """Everything the gate's steps need, decided once per flow run (kept in the flow's data)."""
    node_type = node_type_for(host, claim)
    cleaning = effective_cleaning(host, node_type=node_type)
    method = cleaning["method"]
    gpus_inventory = gpu_count(host.inventory)
    tiers = node_type_tiers(node_type)
    expected = 0
    if node_type is not None:
        try:
            expected = int(float(node_type.resources.get(GPU_RESOURCE, 0) or 0))
        except (TypeError, ValueError):
            expected = 0
    gate = {
        "node_type": node_type.name if node_type else "",
        "policy": {"method": method, "fallback": cleaning["fallback"], "source": cleaning["source"],
                   "concurrency": node_type.erase_concurrency if node_type else 4,
                   "verify_share": node_type.erase_verify_share if node_type else 0.01,
                   "verify_mode": "full" if node_type and node_type.erase_verify_full else "sampled"},
        "health": {"expected_gpus": max(expected, gpus_inventory),
                   "dcgm_level": tiers["release"]["dcgmLevel"],
                   "nccl_min_busbw_gbps": tiers["release"]["ncclMinBusbwGBps"],
                   "budget": tiers["release"].get("budget"), "budget_s": tiers["release"].get("budget_s")},
        "gpu": node_type_gpu(node_type),
    }
    if host.automated_cleaning_mode == "disabled":
        gate["policy"]["note"] = ("automatedCleaningMode: disabled is not honoured: no host returns to the pool "
                                  "without a verified erase")
    return gate


def canary_key(flow_id: str) -> str:
    """The erase's key: the same for every retry of one flow run (canaries are never planted twice under
    different keys), different for every run, and unknown outside the console (derived from SECRET_KEY)."""
    return salted_hmac("vmetal.erase-canary", flow_id, algorithm="sha256").hexdigest()


def previous_use(host: BareMetalHost, claim=None) -> dict:
    """Whose data the erase removes: the releasing claim, else the last claim that ran on the host since its
    last verified erase (a provisioning failure that was cleaned), else nobody. The Event log names them: a
    host's events carry its claim's id and tenant, and a claim's own events its name."""
    if claim is not None:
        return {"tenant": claim.tenant.name, "claim": claim.name}
    last_clean = (EraseCertificate.objects.filter(host=host, result="pass").order_by("-created_at")
                  .values_list("created_at", flat=True).first())
    events = Event.objects.filter(host=host, claim__isnull=False)
    if last_clean:
        events = events.filter(created_at__gt=last_clean)
    event = events.order_by("-id").values("claim_id", "tenant_id").first()
    if event is None:
        return {"tenant": "", "claim": ""}
    name = (Event.objects.filter(claim_id=event["claim_id"], object_type=ObjectType.CLAIM).order_by("id")
            .values_list("object_name", flat=True).first())
    tenant = Tenant.objects.filter(pk=event["tenant_id"]).values_list("name", flat=True).first() or ""
    return {"tenant": tenant, "claim": name or f"#{event['claim_id']}"}


# --- judging the read-back ------------------------------------------------------------------------

def judge_disk(erased: dict | None, verified: dict | None) -> tuple[bool, list[str]]:
    """Recount what the agent reports; anything missing or inconsistent fails. (passed, findings)"""
    problems = []
    if erased is None or not erased.get("ok", False):
        problems.append(f"erase failed: {(erased or {}).get('error', 'no erase record')}")
    if verified is None:
        problems.append("not verified")
        return False, problems
    if verified.get("error"):
        problems.append(f"verification could not be done: {verified['error']}")
    canaries = verified.get("canaries") or {}
    samples = verified.get("samples") or {}
    if not canaries.get("checked"):
        problems.append("no canary was read back")
    if canaries.get("survived"):
        problems.append(f"{canaries['survived']} of {canaries.get('checked')} canaries survived the erase")
    if samples.get("dirty"):
        problems.append(f"{samples['dirty']} sampled region(s) hold data after an erase that writes zeros")
    if samples.get("unchanged"):
        problems.append(f"{samples['unchanged']} sampled chunk(s) hold what they held before the erase")
    if verified.get("canary_blocks_found"):
        problems.append(f"{verified['canary_blocks_found']} block(s) of canary data found in the full read-back")
    if not verified.get("direct_io"):
        problems.append("the read-back did not use O_DIRECT")
    if not problems and verified.get("passed") is not True:
        problems.append("the agent reported a failed verification")
    details = [f for f in verified.get("findings") or [] if f not in problems]
    return not problems, problems + details


def _verification_method(verified: dict | None) -> str:
    if not verified:
        return "none (the erase failed before it could be verified)"
    c, s = verified.get("canaries") or {}, verified.get("samples") or {}
    if verified.get("mode") == "full":
        how = "full read-back of every claimed byte"
    elif s.get("share", 0) >= 1:
        how = "full read-back of the erased regions"
    else:
        how = (f"pseudorandom stratified sample of {100 * s.get('share', 0):g}% of the address space in "
               f"{s.get('chunk', 0) // 1024} KiB chunks ({s.get('count', 0)} chunks)")
    expect = ("all zeros expected" if verified.get("expectation") == "zeros" else
              "content indeterminate after the erase: zeros not expected, sampled chunks must differ from "
              "what they held before")
    return (f"{c.get('checked', 0)} keyed canaries (4 KiB each, incl. first and last MiB) planted before the "
            f"erase and read back after it; {how}; {expect}; all I/O with O_DIRECT")


@transaction.atomic
def issue_certificates(*, host: BareMetalHost, flow_id: str, gate: dict, previous: dict, erase: dict | None,
                       verify: dict | None, census: dict | None, boot: dict | None = None,
                       boot_id: str = "") -> list[EraseCertificate]:
    """One signed certificate per disk (pass or fail): each disk the agent reported, held against the census
    taken before the erase (hosts/gate/census.py), and each disk of the census it did not report (a failed one, the
    evidence). A disk passes only when its read-back passes and it is a disk of the census with the same serial
    and size. Idempotent per flow run and disk."""
    erased_disks = {d["name"]: d for d in (erase or {}).get("disks", [])}
    verified_disks = {d["name"]: d for d in (verify or {}).get("disks", [])} if verify else {}
    names = list(dict.fromkeys([*erased_disks, *verified_disks]))
    reported = [{**(verified_disks.get(n) or {}), **(erased_disks.get(n) or {}), "name": n} for n in names]
    of, census_findings, missing = census_match(census, reported)
    issued = []
    now = timezone.now()
    items = [(n, erased_disks.get(n), verified_disks.get(n), of[n], census_findings[n]) for n in names]
    items += [(m["disk"], None, None, m, m["findings"]) for m in missing]
    for name, erased, verified, observed, problems in items:
        existing = EraseCertificate.objects.filter(flow_id=flow_id, disk=name).first()
        if existing is not None and (existing.result == "pass" or verify is None):
            issued.append(existing)
            continue
        # The plan, not the agent, says whether a disk may be kept: by the census's disk, never the reported one.
        entry = planned_for(gate.get("plan"), observed, name) if observed else None
        kept = bool((erased or {}).get("kept"))
        if erased is None and verified is None:  # a disk of the census the agent never reported
            passed, findings = False, list(problems)
        elif kept and entry is not None and entry["action"] == "keep":
            passed, findings = not problems, list(problems)
        elif kept:
            passed = False
            findings = problems + (plan_findings(entry, erased) or [
                "the agent kept this disk, and no plan of the console keeps it"])
        else:
            passed, findings = judge_disk(erased, verified)
            broken = plan_findings(entry, erased)
            passed, findings = passed and not problems and not broken, problems + broken + findings
            if entry is not None and entry["action"] == "keep":
                findings.append("the plan kept this disk; the agent erased it (its data is gone)")
        body = certificate_body(host=host, flow_id=flow_id, gate=gate, previous=previous, disk=name,
                                erased=erased or {}, verified=verified, passed=passed, findings=findings,
                                census=census, observed=observed, census_findings=problems, boot=boot,
                                boot_id=boot_id, at=now, planned=entry)
        signature, signed_with = certificates.sign(body)
        fields = {"host": host, "host_name": host.name, "serial": (observed or {}).get("serial") or "",
                  "model": (observed or {}).get("model") or "",
                  "method": (erased or {}).get("method") or (verified or {}).get("method") or "",
                  "method_type": "" if kept else (erased or {}).get("method_type") or "",
                  "result": "pass" if passed else "fail",
                  "previous_tenant": previous.get("tenant", ""), "claim_name": previous.get("claim", ""),
                  "started_at": parse_datetime((erased or {}).get("started_at") or ""),
                  "ended_at": parse_datetime((erased or {}).get("ended_at") or ""),
                  "document": body, "signature": signature, "key_id": signed_with}
        if existing is not None:  # a failed-erase record completed by its verification
            EraseCertificate.objects.filter(pk=existing.pk).update(**fields)
            existing.refresh_from_db()
            issued.append(existing)
            continue
        try:
            with transaction.atomic():
                issued.append(EraseCertificate.objects.create(flow_id=flow_id, disk=name, **fields))
        except IntegrityError:
            issued.append(EraseCertificate.objects.get(flow_id=flow_id, disk=name))
    certificates_archive_on_commit(issued)  # a copy outside the database, for after a restore
    return issued


def _disk_policy(gate: dict, planned: dict | None, erased: dict, passed: bool) -> dict | None:
    """What the erase plan chose for this disk and why (hosts/gate/plan.py), and the level reached: "Purge by NVMe
    sanitize crypto erase: ...", "kept: ...". None for an erase without a per-disk plan."""
    plan = gate.get("plan")
    if planned is None:
        return {"next_owner": plan.get("next_owner"), "why": "this disk is not in the erase plan"} if plan else None
    out = {"next_owner": plan.get("next_owner"), "pool": plan.get("pool"), "role": planned["role"],
           "action": planned["action"], "planned_level": planned["level"], "planned_methods": planned["methods"]}
    if erased.get("kept"):
        return {**out, "level": None, "method": "kept", "why": planned["why"]}
    level, method = erased.get("method_type") or None, erased.get("method") or ""
    words = METHOD_WORDS.get(method, method or "no method")
    details = erased.get("method_details")
    why = f"{level or 'no sanitisation'} by {words}{f' ({details})' if details else ''}: {planned['why']}"
    if planned["level"] == "Purge" and level == "Clear":
        why += ("; only Clear was possible: " + (erased.get("fallback_reason") or "the drive has no enhanced "
                                                 "(purge) erase, only the normal one"))
    if not passed:
        why += "; not achieved: see the verification's findings"
    return {**out, "level": level, "method": method, "why": why}


def certificate_body(*, host, flow_id, gate, previous, disk, erased, verified, passed, findings, census, observed,
                     census_findings, boot, boot_id, at, planned: dict | None = None) -> dict:
    """The fields of NIST SP 800-88 Rev. 2 Appendix G, plus host, previous tenant and claim. What identifies the
    medium (`media`) is what the console observed itself: the census's disk (inventory of record, BMC), never
    the agent's word; `observed_by_console` and `reported_by_agent` say which facts come from whom."""
    location = ", ".join(f"{k}={v}" for k, v in sorted((host.labels or {}).items()) if k in ("rack", "zone", "site"))
    fallback = ({"from": erased.get("fallback_from"), "reason": erased.get("fallback_reason")}
                if erased.get("fallback_from") else None)
    seen = observed or {}
    media_type = MEDIA.get(seen.get("type") or "", seen.get("type") or "unknown")
    told = {**(verified or {}), **erased}
    kept = bool(erased.get("kept")) and bool(planned) and planned.get("action") == "keep"
    return {
        "certificate_id": str(uuid.uuid4()),
        "standard": "NIST SP 800-88 Rev. 2, Appendix G: certificate of sanitization",
        "issued_at": at.isoformat(),
        "host": {"name": host.name, "system_serial": ((host.inventory or {}).get("system") or {}).get("serial"),
                 "node_type": gate.get("node_type") or None, "location": location or None},
        "previous_tenant": previous.get("tenant") or None,
        "claim": previous.get("claim") or None,
        "flow_id": flow_id,
        "media": {"manufacturer": _manufacturer(seen.get("model")) if observed else None,
                  "model": seen.get("model") or None, "serial": seen.get("serial") or None,
                  "media_type": media_type if observed else "unknown",
                  "size_bytes": seen.get("size_bytes") or seen.get("bmc_size_bytes") or None,
                  "source": f"bare-metal host {host.name}, disk {disk}",
                  "identified_by": (f"the console's census ({_census_source(seen.get('source'))})" if observed else
                                    "nobody: the agent reported a disk that is not in the census")},
        "observed_by_console": {
            "census": {"source": (census or {}).get("source") or None, "taken_at": (census or {}).get("taken_at"),
                       "inventory_recorded_at": (census or {}).get("inventory_recorded_at"),
                       "bmc": (census or {}).get("bmc"),
                       "disks": [{k: d.get(k) for k in ("serial", "size_bytes", "source")}
                                 for d in (census or {}).get("disks") or []],
                       "this_disk": ({k: seen.get(k) for k in ("name", "serial", "model", "size_bytes", "source",
                                                               "bmc_size_bytes") if seen.get(k) is not None}
                                     if observed else None)},
            "boot": boot or None,
            "judgement": "the console recounted the agent's read-back (canaries, samples, O_DIRECT) and held the "
                         "reported disk against the census; it did not read the disk itself",
        },
        "reported_by_agent": {
            "disk": {k: told.get(k) for k in ("name", "serial", "model", "vendor", "type", "size_bytes")
                     if told.get(k) is not None} or None,
            "matches_census": bool(observed) and not census_findings,
            "note": "the sanitization and the verification below are the agent's report of what it did and read",
        },
        "classification": "tenant data (its confidentiality is the tenant's to set; the operator treats it as "
                          "confidential)",
        "sanitization": {
            "method_type": erased.get("method_type") or None,
            "method": erased.get("method"),
            "method_details": erased.get("method_details") or erased.get("error"),
            "requested_policy": erased.get("requested") or gate.get("policy", {}).get("method"),
            "policy_source": gate.get("policy", {}).get("source"),
            "fallback": fallback,
            "attempts": erased.get("attempts") or [],
            "tool": erased.get("tool"), "tool_version": erased.get("tool_version"),
            "commands": erased.get("commands") or [],
            "started_at": erased.get("started_at"), "ended_at": erased.get("ended_at"),
        },
        "disk_policy": _disk_policy(gate, planned, erased, passed),
        "verification": {
            "method": ("none: the disk was kept, not erased" if kept else _verification_method(verified)),
            "mode": (verified or {}).get("mode"),
            "expectation": (verified or {}).get("expectation"),
            "canaries": (verified or {}).get("canaries"),
            "samples": {k: v for k, v in ((verified or {}).get("samples") or {}).items()},
            "bytes_read": (verified or {}).get("bytes_read"),
            "direct_io": (verified or {}).get("direct_io"),
            "result": "pass" if passed else "fail",
            "findings": findings,
        },
        "post_sanitization_classification": (
            f"tenant data remains: kept for pool {(gate.get('plan') or {}).get('pool')}, whose re-image alone may "
            "have the host" if kept and passed else
            "no tenant data remains (verified: the agent's read-back of keyed canaries and samples, recounted by "
            "the console, on a disk of the console's census)" if passed
            else "tenant data may remain: not cleared for reuse"),
        "destination": (f"the same pool ({(gate.get('plan') or {}).get('pool')}), re-imaged; the host is held for "
                        "it" if kept and passed else
                        "reuse within the vMetal fleet, once the host's GPU health suite passes" if passed
                        else "the repair pool, with this record as evidence"),
        "sanitized_by": {"name": f"vmetal-agent {agent_version}", "title": "ramdisk agent (automated)",
                         "date": erased.get("ended_at"), "location": host.name,
                         "boot_id": boot_id or None},
        "validated_by": {"name": "vMetal Console", "title": "release gate (system:flow)", "date": at.isoformat(),
                         "location": location or None},
        "result": ("kept" if kept else "pass") if passed else "fail",
    }


def _census_source(source: str | None) -> str:
    return {"inventory": "inventory of record", "bmc": "the BMC's storage", "both": "inventory of record and the "
            "BMC's storage"}.get(source or "", "unknown")


def _manufacturer(model: str | None) -> str | None:
    if not model:
        return None
    first = model.split()[0]
    return first if first.isalpha() and first.isupper() else None


def record_health(*, host: BareMetalHost, flow_id: str, suite: str, gate: dict, parsed: dict, raw: dict,
                  thresholds: dict) -> HealthCheckRun:
    fields = {"host": host, "host_name": host.name, "node_type": gate.get("node_type", ""),
              "command": raw.get("command", ""), "exit_code": raw.get("exit_code"),
              "raw_output": ((raw.get("stdout") or "") + (("\n--- stderr ---\n" + raw["stderr"])
                                                         if raw.get("stderr") else ""))[-1_000_000:],
              "raw_json": (raw.get("json") or "")[-1_000_000:], "verdict": parsed["verdict"],
              "reasons": parsed.get("reasons", []), "gpus": parsed.get("gpus") or {}, "parsed": parsed,
              "thresholds": thresholds, "duration_s": raw.get("duration_s")}
    run, _ = HealthCheckRun.objects.update_or_create(flow_id=flow_id, suite=suite, tier=gate.get("tier", "release"),
                                                     defaults=fields)
    return run
