"""The Chain page's inline entries: validation across rows and a save that never trips
the ``(chain, position)`` / ``(chain, provider)`` unique constraints.

Django's inline formset saves row by row, so any permutation (a swap of positions 0 and 1,
a provider moved from one row to another, a new row taking a deleted row's place) passes
validation and then fails half-way with an IntegrityError. Here the whole edit is checked
as one final state (:meth:`ChainEntryFormSet.clean`) and written in two phases inside the
admin's transaction (:func:`save_entries`): first every row whose position or provider
changes is removed (with the deleted rows), then the final rows are written, the changed
ones under their old primary keys. No intermediate state ever holds two rows with the same
position or provider, on any database, without deferrable constraints.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.db import router as db_router
from django.db import transaction

from .models import Chain, ChainEntry, group_steps

__all__ = [
    "ChainEntryForm",
    "ChainEntryFormSet",
    "next_free_position",
    "save_entries",
    "steps_summary",
]


#: The unique constraints checked on the chain's final set of rows, not row by row.
FINAL_STATE_CONSTRAINTS = frozenset(
    {"llm_routing_chainentry_unique_position", "llm_routing_chainentry_unique_provider"}
)


class ChainEntryForm(forms.ModelForm):
    class Meta:
        model = ChainEntry
        fields = ["position", "provider", "model", "enabled", "step", "weight", "strategy"]
        # Dragging is the one way to order (chain_order.js rewrites the hidden positions;
        # without JavaScript the rows keep their order and a new row goes last).
        widgets = {"position": forms.HiddenInput(attrs={"class": "llmr-position"})}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if "weight" in self.fields:
            self.fields["weight"].required = False  # empty: the default, 1

    def clean_weight(self) -> float:
        weight = self.cleaned_data.get("weight")
        return 1.0 if weight is None else float(weight)

    def validate_unique(self) -> None:
        """Uniqueness is a property of the final set of rows, not of one row against the
        rows as stored (which the same edit may be moving): :meth:`ChainEntryFormSet.clean`."""

    def validate_constraints(self) -> None:
        """The model's constraints except the two unique ones :meth:`ChainEntryFormSet.clean`
        checks on the final state. Django 6.0 made this a step of its own (``ModelForm.
        validate_constraints``) that includes the inline foreign key, so it checks the
        unique constraints of one row against the rows as stored, which the same edit
        may be moving (a swap). Django 5.2 never calls it: there ``full_clean`` skips
        them, the inline foreign key being excluded."""
        exclude = {f.name for f in ChainEntry._meta.fields if f.name not in self.cleaned_data}
        for constraint in ChainEntry._meta.constraints:
            if constraint.name in FINAL_STATE_CONSTRAINTS:
                continue
            try:
                constraint.validate(ChainEntry, self.instance, exclude=exclude)
            except ValidationError as exc:
                self.add_error(None, exc)


def next_free_position(chain: Chain | None) -> int:
    if chain is None or chain.pk is None:
        return 0
    positions = list(ChainEntry.objects.filter(chain=chain).values_list("position", flat=True))
    return max(positions) + 1 if positions else 0


class ChainEntryFormSet(forms.BaseInlineFormSet):
    """Validates the final state of the chain's entries as a whole."""

    instance: Chain

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._first_free = next_free_position(self.instance)

    def get_form_kwargs(self, index: int | None) -> dict[str, Any]:
        kwargs = super().get_form_kwargs(index)
        if index is not None and index >= self.initial_form_count():
            # An extra blank row offers the next free position, not the model default 0.
            offset = index - self.initial_form_count()
            kwargs["initial"] = {"position": self._first_free + offset}
        return kwargs

    @property
    def empty_form(self) -> forms.ModelForm[Any]:
        form = super().empty_form
        form.initial["position"] = self._first_free + self.initial_extra_count()
        return form

    def initial_extra_count(self) -> int:
        return max(0, self.total_form_count() - self.initial_form_count())

    def validate_unique(self) -> None:
        """Replaced by :meth:`clean`, which names the clashing position or provider."""

    def clean(self) -> None:
        super().clean()
        if any(self.errors):
            return
        kept = [
            f
            for f in self.forms
            if not self.can_delete or not f.cleaned_data.get("DELETE")
            if f.cleaned_data.get("provider") is not None
        ]
        errors: list[ValidationError] = []
        positions = Counter(f.cleaned_data["position"] for f in kept)
        for position, count in sorted(positions.items()):
            if count > 1:
                errors.append(
                    ValidationError(
                        "%(count)d entries share position %(position)d; give each its own.",
                        code="duplicate_position",
                        params={"count": count, "position": position},
                    )
                )
        providers = Counter(f.cleaned_data["provider"].name for f in kept)
        for name, count in sorted(providers.items()):
            if count > 1:
                errors.append(
                    ValidationError(
                        "Provider %(name)s is listed twice; a chain tries each provider once.",
                        code="duplicate_provider",
                        params={"name": name},
                    )
                )
        by_step: dict[int, set[str]] = {}
        for f in kept:
            if f.cleaned_data.get("step") is not None and f.cleaned_data.get("strategy"):
                by_step.setdefault(f.cleaned_data["step"], set()).add(f.cleaned_data["strategy"])
        for step, strategies in sorted(by_step.items()):
            if len(strategies) > 1:
                errors.append(
                    ValidationError(
                        "Step %(step)d has entries with different strategies (%(names)s); "
                        "give every entry of a step the same one.",
                        code="mixed_strategies",
                        params={"step": step, "names": ", ".join(sorted(strategies))},
                    )
                )
        if getattr(self.instance, "is_default", False) and not kept:
            errors.append(
                ValidationError(
                    "The default chain needs at least one entry (or untick 'is default').",
                    code="empty_default",
                )
            )
        if errors:
            raise ValidationError(errors)


def save_entries(formset: ChainEntryFormSet) -> None:
    """Write the formset's final state in two phases (see the module docstring)."""
    with transaction.atomic(using=db_router.db_for_write(ChainEntry)):
        formset.save(commit=False)  # fills new_objects, changed_objects, deleted_objects
        changed = [obj for obj, _ in formset.changed_objects]
        moved = [
            obj
            for obj, fields in formset.changed_objects
            if "position" in fields or "provider" in fields
        ]
        gone = [obj.pk for obj in formset.deleted_objects] + [obj.pk for obj in moved]
        # Phase 1: nothing that is deleted or moves keeps its old (position, provider).
        ChainEntry.objects.filter(pk__in=gone).delete()
        # Phase 2: the final rows; a moved row is written again under its own id.
        for obj in changed:
            if obj in moved:
                obj.save(force_insert=True)
            else:
                obj.save()
        for obj in formset.new_objects:
            obj.save()


def steps_summary(entries: Iterable[ChainEntry]) -> str:
    """A chain's enabled entries as its steps, for the admin: ``a → weighted(b 1, c
    0.25) → d`` (a step of several: its strategy, each entry with its weight)."""
    ordered = sorted((e for e in entries if e.enabled), key=lambda e: e.position)
    parts: list[str] = []
    for step in group_steps(ordered):
        if len(step) == 1:
            parts.append(step[0].provider.name)
            continue
        strategy = next((e.strategy for e in step if e.strategy), "") or "weighted"
        members = ", ".join(f"{e.provider.name} {e.weight:g}" for e in step)
        parts.append(f"{strategy}({members})")
    return " → ".join(parts)
