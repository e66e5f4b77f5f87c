"""Who did it: the Event log's actor for a change a person made (console, API or admin alike)."""


def actor(request) -> str:
    return f"user:{request.user.get_username()}"
