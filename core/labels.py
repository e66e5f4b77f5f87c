"""Kubernetes' own rules for label keys, label values and taints (k8s.io/apimachinery validation), and
validation errors that carry their position inside a field, so that `apply` can point at the line."""
import re

from django.core.exceptions import ValidationError

QUALIFIED_NAME_MAX = 63
PREFIX_MAX = 253
LABEL_VALUE_MAX = 63
NAME_PART = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
TAINT_FIELDS = {"key", "value", "effect"}

NAME_RULE = ("consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
             "alphanumeric character (e.g. 'MyName', 'my.name' or '123-abc')")
PREFIX_RULE = ("must be a lowercase RFC 1123 subdomain: lower case alphanumeric characters, '-' or '.', "
               "starting and ending with an alphanumeric character (e.g. 'example.com')")


# --- errors with a position inside their field ----------------------------------------------------

def field_error(path: tuple, message: str) -> ValidationError:
    """A ValidationError about one part of a field (a label key, a taint's effect). Its message names the
    part, for the API and the forms; `error_location` gives `apply` the path and the bare message, so that
    it can name the manifest's line instead."""
    error = ValidationError(f"{dotted(path)}: {message}" if path else message)
    error.vmetal_path, error.vmetal_bare = tuple(path), message
    return error


def error_location(error: ValidationError) -> tuple[tuple, str]:
    """(path inside the field, message without it) of one error of a ValidationError's error_list."""
    if hasattr(error, "vmetal_path"):
        return error.vmetal_path, error.vmetal_bare
    return (), " ".join(error.messages)


def dotted(path: tuple) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


# --- the rules ------------------------------------------------------------------------------------

def qualified_name_problems(key) -> list[str]:
    """What is wrong with a label (or taint, or selector) key: [prefix/]name, Kubernetes' IsQualifiedName."""
    if not isinstance(key, str):
        return ["must be a string"]
    parts = key.split("/")
    if len(parts) > 2:
        return ["a qualified name is an optional DNS subdomain prefix and a name, with one '/' between them "
                "(e.g. 'example.com/my-name')"]
    name = parts[-1]
    problems = []
    if len(parts) == 2:
        prefix = parts[0]
        if not prefix:
            problems.append("prefix part must be non-empty")
        elif len(prefix) > PREFIX_MAX:
            problems.append(f"prefix part must be no more than {PREFIX_MAX} characters")
        elif not DNS_SUBDOMAIN.match(prefix):
            problems.append(f"prefix part {PREFIX_RULE}")
    if not name:
        problems.append("name part must be non-empty")
    elif len(name) > QUALIFIED_NAME_MAX:
        problems.append(f"name part must be no more than {QUALIFIED_NAME_MAX} characters")
    elif not NAME_PART.match(name):
        problems.append(f"name part must {NAME_RULE}")
    return problems


def label_value_problems(value) -> list[str]:
    if not isinstance(value, str):
        return ["must be a string"]
    if len(value) > LABEL_VALUE_MAX:
        return [f"must be no more than {LABEL_VALUE_MAX} characters"]
    if not LABEL_VALUE.match(value):
        return [f"must be empty or {NAME_RULE}"]
    return []


def key_errors(key, path: tuple, what: str = "label key") -> list[ValidationError]:
    return [field_error(path, f"{key!r} is not a valid {what}: {p}") for p in qualified_name_problems(key)]


def value_errors(value, path: tuple, what: str = "label value") -> list[ValidationError]:
    return [field_error(path, f"{value!r} is not a valid {what}: {p}") for p in label_value_problems(value)]


def label_errors(labels: dict, path: tuple = ()) -> list[ValidationError]:
    """Every bad key and value of a label map (a string map already), each at its key."""
    errors = []
    for key, value in labels.items():
        errors += key_errors(key, path + (key,)) + value_errors(value, path + (key,))
    return errors


def taint_errors(taints: list) -> list[ValidationError]:
    """Every problem of a list of taints {key, value?, effect}, each at its taint and field."""
    errors = []
    for i, taint in enumerate(taints):
        if not isinstance(taint, dict):
            errors.append(field_error((i,), "must be a mapping {key, value, effect}"))
            continue
        unknown = sorted(set(map(str, taint)) - TAINT_FIELDS)
        if unknown:
            errors.append(field_error((i, unknown[0]), f"unknown field(s) {', '.join(unknown)}; "
                                                       "a taint has key, value and effect"))
        if not taint.get("key"):
            errors.append(field_error((i,), "key is required"))
        else:
            errors += key_errors(taint["key"], (i, "key"), "taint key")
        if taint.get("value") is not None:
            errors += value_errors(taint["value"], (i, "value"), "taint value")
        if taint.get("effect") not in TAINT_EFFECTS:
            errors.append(field_error((i, "effect") if "effect" in taint else (i,),
                                      f"effect must be one of {', '.join(TAINT_EFFECTS)}, not {taint.get('effect')!r}"))
    return errors


def validate_labels(labels) -> None:
    """Model.clean() and serializers: a label map (strings to strings) whose keys and values Kubernetes takes."""
    errors = label_errors(labels) if isinstance(labels, dict) else []
    if errors:
        raise ValidationError(errors)


def validate_taints(taints) -> None:
    if not isinstance(taints, list):
        raise ValidationError("taints must be a list of {key, value, effect}")
    errors = taint_errors(taints)
    if errors:
        raise ValidationError(errors)
