"""Forms of the tenancy pages."""

from __future__ import annotations

from django import forms

from tenancy.quotas import LIMIT_MAX, QUOTAS


class QuotaForm(forms.Form):
    """A workspace's quota limits; an empty field is unlimited."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        for quota in QUOTAS:
            kind = forms.IntegerField if quota.whole else forms.FloatField
            label = f"{quota.label} ({quota.unit})" if quota.unit else quota.label
            self.fields[quota.name] = kind(
                label=label, required=False, min_value=0, max_value=LIMIT_MAX, help_text="Empty: unlimited."
            )
