"""What each endpoint replica holds on its node (counted by the quotas); replicas from before count what
their endpoint asked, as they did until now."""

from django.db import migrations, models
from django.db.models import OuterRef, Subquery


def held_as_asked(apps, schema_editor):
    replica = apps.get_model("fleet", "EndpointReplica")
    endpoint = apps.get_model("fleet", "Endpoint").objects.filter(pk=OuterRef("endpoint_id"))
    replica.objects.update(
        held_gpus=Subquery(endpoint.values("gpus")[:1]), held_vram_mb=Subquery(endpoint.values("min_vram_mb")[:1])
    )


class Migration(migrations.Migration):
    dependencies = [
        ("fleet", "0022_args_endpoint_server_args"),
    ]

    operations = [
        migrations.AddField(
            model_name="endpointreplica",
            name="held_gpus",
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.AddField(
            model_name="endpointreplica",
            name="held_vram_mb",
            field=models.PositiveBigIntegerField(default=0),
        ),
        migrations.RunPython(held_as_asked, migrations.RunPython.noop),
    ]
