"""Endpoints: autoscaling targets on requests in flight and tokens per second per replica (0 = off)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("fleet", "0019_endpoint_events")]

    operations = [
        migrations.AddField(
            model_name="endpoint", name="target_in_flight", field=models.PositiveIntegerField(default=0)
        ),
        migrations.AddField(
            model_name="endpoint", name="target_tokens_per_s", field=models.PositiveIntegerField(default=0)
        ),
    ]
