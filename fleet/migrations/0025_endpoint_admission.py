from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("fleet", "0024_endpoint_routing_policy")]

    operations = [
        migrations.AddField(
            model_name="endpoint",
            name="max_concurrency",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="endpoint",
            name="queue_max_depth",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="endpoint",
            name="queue_max_wait_s",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="endpoint",
            name="target_queued",
            field=models.PositiveIntegerField(default=0),
        ),
    ]
