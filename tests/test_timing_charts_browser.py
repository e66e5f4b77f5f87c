"""The fleet timing page in real Chromium (issue 17.5): each chart's SVG fills its card, and no label (step
names, values, ticks, legend, axis titles) reaches outside the SVG, the longest flow · step names included."""
import pytest

from events.services import event_record
from hosts.lifecycle import FLOWS
from hosts.models import BareMetalHost

pytest.register_assert_rewrite("tests.console_conftest")
from .console_conftest import log_in  # noqa: E402

pytest_plugins = ["tests.console_conftest"]
pytestmark = pytest.mark.django_db(transaction=True)

GEOMETRY = """(id) => {
  const svg = document.getElementById(id);
  const card = svg.closest('.card');
  const style = getComputedStyle(card);
  const inner = card.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
  const box = svg.getBoundingClientRect();
  const texts = [...svg.querySelectorAll('text')].map(t => {
    const r = t.getBoundingClientRect();
    return {text: t.textContent, left: r.left, right: r.right, top: r.top, bottom: r.bottom};
  });
  return {inner, width: box.width, height: box.height, cardOverflow: card.scrollWidth - card.clientWidth,
          box: {left: box.left, right: box.right, top: box.top, bottom: box.bottom}, texts};
}"""


def assert_fills_its_card_and_clips_nothing(page, svg_id: str) -> None:
    g = page.evaluate(GEOMETRY, svg_id)
    assert g["width"] >= g["inner"] - 1, g  # as wide as the card's content box, not half of it
    assert g["cardOverflow"] <= 0, g  # on a narrow screen the chart scrolls inside its box, the card keeps its width
    assert g["height"] > 50
    assert g["texts"]
    box = g["box"]
    for t in g["texts"]:
        assert t["left"] >= box["left"] - 0.5 and t["right"] <= box["right"] + 0.5, (t, box)
        assert t["top"] >= box["top"] - 0.5 and t["bottom"] <= box["bottom"] + 0.5, (t, box)


def test_the_timing_charts_fill_their_cards_and_clip_no_label(browser_page, users):
    host = BareMetalHost.objects.order_by("name").first()
    for flow in ("register", "inspect", "provision", "deprovision", "retest"):
        for i, step in enumerate(dict.fromkeys(s.name for s in FLOWS[flow].steps)):
            # The longest bar carries the widest value label, at the right edge.
            seconds = 1234.5 if step == "write_image" else 0.4 + i
            event_record(kind="step", object_type="host", object_name=host.name, host=host, step=step,
                         message="done", duration_s=seconds, actor="system:flow", data={"flow": flow})
    page = browser_page
    log_in(page, "root-admin")
    for width in (1360, 900, 390):
        page.set_viewport_size({"width": width, "height": 900})
        page.goto("/timing/")
        assert page.locator("#timing-chart g[data-step] text").first.text_content() == "register · bmc_check"
        assert_fills_its_card_and_clips_nothing(page, "timing-chart")
        assert_fills_its_card_and_clips_nothing(page, "state-history")
