"""Auto Nodes' declared statuses, with their labels and badge colours."""
from core.choices import ColouredChoices


class DemandStatus(ColouredChoices):
    """What the console made of one Pending pod."""

    NEW = "new", "New", "secondary"  # seen, not decided yet (inside a batch window)
    LAUNCHED = "launched", "Provisioning", "warning"  # a claim was created (or is in flight) for it
    WAITING = "waiting", "Waiting for capacity", "secondary"  # fits a pool but a limit, quota or free servers stop it
    UNSERVABLE = "unservable", "No pool can serve it", "danger"  # reported once; decided again when pools change


class WatchState(ColouredChoices):
    """The pod watcher of one tenant."""

    STARTING = "starting", "Starting", "secondary"
    WATCHING = "watching", "Watching", "success"
    BACKING_OFF = "backing-off", "Tenant API unreachable (retrying)", "danger"
    STOPPED = "stopped", "Stopped", "dark"


class DecisionReason(ColouredChoices):
    """Data["reason"] of a decision Event (events.EventKind.DECISION)."""

    LAUNCHED = "Launched", "Nodes added", "success"
    LIMIT = "LimitReached", "Not added: pool limit", "warning"
    QUOTA = "QuotaReached", "Not added: tenant quota", "warning"
    NO_CAPACITY = "NoCapacity", "Not added: no free server", "warning"
    NO_NODE_TYPE = "NoNodeType", "No NodeType fits", "danger"
    NO_POOL = "NoPool", "No pool matches", "danger"
    EMPTY = "Empty", "Released: empty", "secondary"
    UNDERUTILIZED = "Underutilized", "Released: underutilized", "secondary"
    EXPIRED = "Expired", "Replaced: expired", "secondary"
    DRIFTED = "Drifted", "Replaced: drifted", "secondary"
    BLOCKED = "Blocked", "Disruption blocked", "warning"  # by a budget, do-not-disrupt, minimum lifetime
    SLOW = "LaunchSlow", "Launch slower than usual", "warning"  # past its launch deadline: reported, kept waiting
