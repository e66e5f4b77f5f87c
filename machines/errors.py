"""The error every provider kind raises (machines.kinds), and the clusters they reach (machines.clusters)."""


class KindError(Exception):
    def __init__(self, message: str, *, retry: bool = True):
        super().__init__(message)
        self.message = message
        self.retry = retry
