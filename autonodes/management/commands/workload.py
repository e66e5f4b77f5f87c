"""python manage.py workload submit|delete|list --tenant NAME: a tenant's batch/v1 Job, for demos of Auto Nodes."""
# `submit --name train-7 --pods 3 --gpus 8` creates a Job of 3 pods that each ask for 8 nvidia.com/gpu (and run
# until the Job is deleted: the pause image), in the tenant's own Kubernetes API through the official client,
# with the kubeconfig the console keeps for the tenant: the same call works on the lab and on a real cluster.
# `list` shows each pod's node, or Pending with the scheduler's message; `delete` removes the Job and its pods.
# Nothing here prints the kubeconfig or its token.
import re

from django.core.management.base import BaseCommand, CommandError

from autonodes.fit import DO_NOT_DISRUPT
from claims.tenant_api import TAINT_EFFECTS, TenantAPI, TenantAPIError
from core.labels import label_value_problems, qualified_name_problems
from pools.models import Tenant
from pools.validators import parse_quantity

NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")  # a Job's name becomes a label value: 63 at most
GPU = "nvidia.com/gpu"
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"


def _name(value: str) -> str:
    if not NAME_RE.match(value or ""):
        raise CommandError(f"--name {value!r}: lower-case letters, digits and '-', 63 at most, starting and ending "
                           "with a letter or digit")
    return value


def _quantity(flag: str, value: str | None) -> str | None:
    if value is None:
        return None
    try:
        if parse_quantity(value) <= 0:
            raise ValueError
    except (TypeError, ValueError):
        raise CommandError(f"{flag} {value!r}: not a positive quantity (e.g. 4, 500m, 16Gi)") from None
    return value


def _selector(items: list[str]) -> dict:
    selector = {}
    for item in items:
        key, sep, value = item.partition("=")
        problems = qualified_name_problems(key) + label_value_problems(value) if sep else ["expected KEY=VALUE"]
        if problems:
            raise CommandError(f"--node-selector {item!r}: {'; '.join(problems)}")
        selector[key] = value
    return selector


def _tolerations(items: list[str]) -> list[dict]:
    """KEY[=VALUE][:EFFECT]: with a value, Equal; without, Exists; without an effect, every effect."""
    tolerations = []
    for item in items:
        head, _, effect = item.rpartition(":") if ":" in item else (item, "", "")
        key, sep, value = head.partition("=")
        if effect and effect not in TAINT_EFFECTS:
            raise CommandError(f"--toleration {item!r}: the effect must be one of {', '.join(TAINT_EFFECTS)}")
        if problems := qualified_name_problems(key) + (label_value_problems(value) if sep else []):
            raise CommandError(f"--toleration {item!r}: {'; '.join(problems)}")
        toleration = {"key": key, "operator": "Equal" if sep else "Exists"}
        if sep:
            toleration["value"] = value
        if effect:
            toleration["effect"] = effect
        tolerations.append(toleration)
    return tolerations


def job_manifest(*, name: str, pods: int, gpus: int, cpu: str | None, memory: str | None, node_selector: dict,
                 tolerations: list[dict], do_not_disrupt: bool, image: str) -> dict:
    """A Job of `pods` pods in parallel, each asking for the given resources (GPUs as requests and limits: the API
    server wants extended resources in both), which run until the Job is deleted."""
    requests = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None}
    limits = {}
    if gpus:
        requests[GPU] = limits[GPU] = str(gpus)
    container = {"name": "main", "image": image, "resources": {"requests": requests, **({"limits": limits} if limits else {})}}
    template_meta = {"labels": {"app.kubernetes.io/name": name, "app.kubernetes.io/managed-by": "vmetal-workload"}}
    if do_not_disrupt:
        template_meta["annotations"] = {DO_NOT_DISRUPT: "true"}
    pod_spec = {"restartPolicy": "Never", "containers": [container]}
    if node_selector:
        pod_spec["nodeSelector"] = node_selector
    if tolerations:
        pod_spec["tolerations"] = tolerations
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "vmetal-workload"}},
            # An evicted pod (consolidation drains nodes) is replaced, not counted as a failure of the Job.
            "spec": {"parallelism": pods, "completions": pods,
                     "podFailurePolicy": {"rules": [{"action": "Ignore",
                                                     "onPodConditions": [{"type": "DisruptionTarget"}]}]},
                     "template": {"metadata": template_meta, "spec": pod_spec}}}


def pod_state(pod: dict) -> str:
    """The node a pod runs on, or Pending with what the scheduler said."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    if meta.get("deletionTimestamp"):
        return f"Terminating (on {spec['nodeName']})" if spec.get("nodeName") else "Terminating"
    if spec.get("nodeName"):
        return f"{status.get('phase') or 'Running'} on {spec['nodeName']}"
    scheduled = next((c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"), {})
    said = scheduled.get("message") or scheduled.get("reason") or "not scheduled yet"
    return f"Pending: {said}"


class Command(BaseCommand):
    help = "Submit, list or delete a demo workload (a batch/v1 Job of GPU pods) in a tenant's Kubernetes API."

    def add_arguments(self, parser):
        actions = parser.add_subparsers(dest="action", required=True, metavar="submit|delete|list")
        submit = actions.add_parser("submit", help="create a Job of --pods pods, each asking for --gpus GPUs")
        delete = actions.add_parser("delete", help="delete the Job and its pods")
        listing = actions.add_parser("list", help="the tenant's Jobs, each pod with its node or why it is Pending")
        for sub in (submit, delete, listing):
            sub.add_argument("--tenant", required=True, help="the tenant whose API gets the Job")
            sub.add_argument("--namespace", default="default")
        for sub in (submit, delete):
            sub.add_argument("--name", required=True, help="the Job's name, e.g. train-7")
        submit.add_argument("--pods", type=int, default=1, help="pods running in parallel (default 1)")
        submit.add_argument("--gpus", type=int, default=0, help=f"{GPU} per pod (default 0)")
        submit.add_argument("--cpu", help="cpu per pod, e.g. 4 or 500m")
        submit.add_argument("--memory", help="memory per pod, e.g. 16Gi")
        submit.add_argument("--node-selector", action="append", default=[], metavar="KEY=VALUE")
        submit.add_argument("--toleration", action="append", default=[], metavar="KEY[=VALUE][:EFFECT]")
        submit.add_argument("--do-not-disrupt", action="store_true",
                            help=f"annotate the pods {DO_NOT_DISRUPT}=true: their nodes are not consolidated")
        submit.add_argument("--image", default=PAUSE_IMAGE, help="the container image (default: %(default)s)")

    def handle(self, *args, **options):
        tenant = Tenant.objects.filter(name=options["tenant"]).first()
        if tenant is None:
            raise CommandError(f"tenant {options['tenant']!r} not found")
        if not tenant.kubeconfig:
            raise CommandError(f"tenant {tenant.name} has no Kubernetes API registered (no kubeconfig): the lab "
                               "registers its tenants' APIs, an admin sets one on the tenant")
        action = options["action"]
        job = self._job(options) if action == "submit" else None  # flags checked before any call
        try:
            api = TenantAPI(tenant.kubeconfig)
            getattr(self, f"_{action}")(api, tenant, options, job)
        except TenantAPIError as exc:  # its messages name the API server and the object, never a credential
            raise CommandError(f"tenant {tenant.name}: {exc}") from None

    def _job(self, options) -> dict:
        if options["pods"] < 1:
            raise CommandError(f"--pods {options['pods']}: at least 1")
        if options["gpus"] < 0:
            raise CommandError(f"--gpus {options['gpus']}: 0 or more")
        return job_manifest(name=_name(options["name"]), pods=options["pods"], gpus=options["gpus"],
                            cpu=_quantity("--cpu", options["cpu"]), memory=_quantity("--memory", options["memory"]),
                            node_selector=_selector(options["node_selector"]),
                            tolerations=_tolerations(options["toleration"]),
                            do_not_disrupt=options["do_not_disrupt"], image=options["image"])

    def _submit(self, api: TenantAPI, tenant: Tenant, options, job: dict) -> None:
        where = f"{options['namespace']}/{options['name']}"
        try:
            api.create_job(options["namespace"], job)
        except TenantAPIError as exc:
            if exc.status == 409:
                raise CommandError(f"tenant {tenant.name}: job {where} already exists (delete it first)") from None
            raise
        container = job["spec"]["template"]["spec"]["containers"][0]
        asks = ", ".join(f"{value} {key}" for key, value in container["resources"]["requests"].items()) or "nothing"
        self.stdout.write(f"job {where} submitted to tenant {tenant.name}: {options['pods']} pod(s), each asking "
                          f"for {asks}")
        self.stdout.write(f"follow it: python manage.py workload list --tenant {tenant.name}")

    def _delete(self, api: TenantAPI, tenant: Tenant, options, job) -> None:
        where = f"{options['namespace']}/{_name(options['name'])}"
        if not api.delete_job(options["namespace"], options["name"]):
            raise CommandError(f"tenant {tenant.name}: job {where} not found")
        self.stdout.write(f"job {where} deleted from tenant {tenant.name}; its pods terminate")

    def _list(self, api: TenantAPI, tenant: Tenant, options, job) -> None:
        jobs = api.list_jobs(options["namespace"])
        if not jobs:
            self.stdout.write(f"no jobs in tenant {tenant.name}, namespace {options['namespace']}")
            return
        for item in sorted(jobs, key=lambda j: j["metadata"]["name"]):
            name = item["metadata"]["name"]
            pods = api.list_pods(options["namespace"], label_selector=f"job-name={name}")
            pods.sort(key=lambda p: (p["metadata"].get("creationTimestamp") or "", p["metadata"]["name"]))
            terminating = sum(1 for p in pods if p["metadata"].get("deletionTimestamp"))
            running = sum(1 for p in pods if (p.get("spec") or {}).get("nodeName")
                          and not p["metadata"].get("deletionTimestamp"))
            counts = f"{running} running, {len(pods) - running - terminating} pending" + (
                f", {terminating} terminating" if terminating else "")
            self.stdout.write(f"job {options['namespace']}/{name}: {len(pods)} pod(s): {counts}")
            for pod in pods:
                self.stdout.write(f"  {pod['metadata']['name']}  {pod_state(pod)}")
