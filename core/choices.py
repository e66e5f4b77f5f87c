"""Choices that declare a badge colour beside each label (NetBox's `DeviceStatusChoices`): a state is
declared once, with its label and its colour, and pages, partials and the admin ask the choices for it."""
from django.db.models.enums import ChoicesType, TextChoices

DEFAULT_COLOUR = "secondary"


class ColouredChoicesType(ChoicesType):
    """Members are (value, label, colour); the colour is kept on the member and the rest is Django's."""

    def __new__(metacls, classname, bases, classdict, **kwds):
        colours = {}
        for key in classdict._member_names:
            value = classdict[key]
            if not (isinstance(value, tuple) and len(value) == 3):
                raise TypeError(f"{classname}.{key}: declare (value, label, colour)")
            colours[key] = value[2]
            dict.__setitem__(classdict, key, value[:2])
        cls = super().__new__(metacls, classname, bases, classdict, **kwds)
        for name, member in cls.__members__.items():
            member._colour_ = colours[name]
        return cls

    @property
    def colours(cls) -> dict[str, str]:
        return {member.value: member._colour_ for member in cls}


class ColouredChoices(TextChoices, metaclass=ColouredChoicesType):
    @classmethod
    def colour(cls, value: str) -> str:
        """The badge colour (a Bootstrap colour name) of a value; unknown values get the neutral one."""
        try:
            return cls(value)._colour_
        except ValueError:
            return DEFAULT_COLOUR
