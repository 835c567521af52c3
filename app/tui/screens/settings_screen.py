"""Per-conversation settings: system prompt, model, draft model and sampling parameters.

Values are checked with ``SamplingParams`` before the dialog closes; a bad value is named in a
notification and the dialog stays open; so is a model or draft that ``check`` refuses (one the
load would refuse: the running engine is not given up for it). Dismisses with a ``ConversationSettings`` or None.
The sampling fields show the values in effect (``defaults`` overlaid with the conversation's
own); only values that differ from ``defaults``, or that the conversation already set, are
returned as the conversation's. The fields scroll; the title and the Save/Cancel row stay on
screen, and the first field has focus when the dialog opens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, TextArea

# SamplingParams field -> (label, Python type)
SAMPLING_FIELDS: dict[str, tuple[str, type]] = {
    "temperature": ("temperature (0 is greedy)", float),
    "top_p": ("top_p, nucleus mass in (0, 1]", float),
    "top_k": ("top_k (0 keeps all)", int),
    "min_p": ("min_p (0 is off)", float),
    "repetition_penalty": ("repetition_penalty (1 is off)", float),
    "max_tokens": ("max_tokens per reply", int),
    "seed": ("seed (empty: random)", int),
}


@dataclass
class ConversationSettings:
    """What the dialog returns: ``sampling`` holds only the fields given."""

    system_prompt: str | None
    model: str | None
    draft: str | None
    sampling: dict[str, Any] = field(default_factory=dict)


class SettingsScreen(ModalScreen[ConversationSettings | None]):
    """Edit ``initial``; Ctrl+S or Save applies, Esc cancels. ``defaults`` are the sampling
    values the conversation gets without its own (shown in the empty fields' place);
    ``check`` returns why the values entered cannot apply (a model that names none), or None."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel"), Binding("ctrl+s", "save", "Save")]

    def __init__(self, initial: ConversationSettings,
                 defaults: dict[str, Any] | None = None,
                 check: Callable[[ConversationSettings], str | None] | None = None) -> None:
        super().__init__()
        self.initial = initial
        self.check = check
        self.defaults = dict(defaults or {})

    def compose(self) -> ComposeResult:
        init = self.initial
        shown = {**self.defaults, **init.sampling}
        with Vertical(classes="dialog", id="settings-dialog"):
            yield Label("Conversation settings", classes="title")
            yield from self._fields(init, shown)
            with Horizontal(classes="buttons"):
                yield Button("Cancel", id="cancel")
                yield Button("Save", id="save", variant="primary")

    def on_mount(self) -> None:
        self.query_one("#system_prompt", TextArea).focus()

    def _fields(self, init: ConversationSettings, shown: dict[str, Any]) -> ComposeResult:
        with VerticalScroll(id="settings-fields"):
            yield Label("system prompt", classes="field-label")
            yield TextArea(init.system_prompt or "", id="system_prompt", soft_wrap=True)
            yield Label("model (alias, Hub repo, folder or .gguf; Ctrl+O lists them)",
                        classes="field-label")
            yield Input(init.model or "", id="model")
            yield Label("draft model for speculative decoding (empty: none)",
                        classes="field-label")
            yield Input(init.draft or "", id="draft")
            for name, (label, _type) in SAMPLING_FIELDS.items():
                yield Label(label, classes="field-label")
                value = shown.get(name)
                yield Input("" if value is None else str(value), id=f"s-{name}")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "save":
            self.action_save()
        else:
            self.action_cancel()

    def action_cancel(self) -> None:
        self.dismiss(None)

    def action_save(self) -> None:
        try:
            result = self.collect()
        except ValueError as exc:
            self.notify(str(exc), severity="error", title="Invalid setting")
            return
        problem = self.check(result) if self.check is not None else None
        if problem:
            self.notify(problem, severity="error", title="Invalid setting")
            return
        self.dismiss(result)

    def collect(self) -> ConversationSettings:
        """The values entered, checked.

        Raises:
            ValueError: a sampling value is not a number or out of ``SamplingParams``' range.
        """
        from localchat.engine.sampling_params import SamplingParams

        sampling: dict[str, Any] = {}
        for name, (_label, kind) in SAMPLING_FIELDS.items():
            raw = self.query_one(f"#s-{name}", Input).value.strip()
            if not raw:
                continue
            try:
                sampling[name] = kind(raw)
            except ValueError:
                what = "an integer" if kind is int else "a number"
                raise ValueError(f"{name} must be {what}, got {raw!r}") from None
        SamplingParams(**{**self.defaults, **sampling})  # raises ValueError naming the field
        sampling = {k: v for k, v in sampling.items()
                    if k in self.initial.sampling or self.defaults.get(k) != v}
        system = self.query_one("#system_prompt", TextArea).text.strip() or None
        model = self.query_one("#model", Input).value.strip() or None
        draft = self.query_one("#draft", Input).value.strip() or None
        return ConversationSettings(system, model, draft, sampling)
