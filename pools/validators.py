"""Field validators shared by models, forms, the API and `apply`."""
import ipaddress
import re

from django.core.exceptions import ValidationError

DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
DURATION = re.compile(r"^(\d+(\.\d+)?(ns|us|µs|ms|s|m|h))+$|^Never$")


def validate_object_name(value: str) -> None:
    if not DNS_SUBDOMAIN.match(value or ""):
        raise ValidationError(
            f"{value!r} is not a valid name: lower-case letters, digits, '-' and '.', "
            "starting and ending with a letter or digit")


def validate_dns_label(value: str) -> None:
    if not DNS_LABEL.match(value or ""):
        raise ValidationError(f"{value!r} is not a valid name: lower-case letters, digits and '-', at most 63")


def validate_duration(value: str) -> None:
    if value and not DURATION.match(value):
        raise ValidationError(f"{value!r} is not a duration such as 30s, 5m, 720h or Never")


def validate_string_map(value, what: str = "labels") -> None:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ValidationError(f"{what} must map strings to strings")


def parse_ip_ranges(text: str) -> list[tuple[ipaddress.IPv4Address, ipaddress.IPv4Address]]:
    """'10.0.0.20-10.0.0.30,10.0.0.40-10.0.0.50' → [(first, last), ...]."""
    ranges = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        first, _, last = part.partition("-")
        try:
            a = ipaddress.ip_address(first.strip())
            b = ipaddress.ip_address((last or first).strip())
        except ValueError:
            raise ValidationError(f"{part!r} is not an IP range such as 10.0.0.20-10.0.0.30") from None
        if b < a:
            raise ValidationError(f"{part!r}: the range ends before it starts")
        ranges.append((a, b))
    return ranges
