from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("fleet", "0023_replica_held_gpus_vram")]

    operations = [
        migrations.AddField(
            model_name="endpoint",
            name="routing_policy",
            field=models.CharField(
                choices=[
                    ("least_load", "Least load"),
                    ("session", "Session affinity"),
                    ("prefix", "Prompt prefix affinity"),
                ],
                default="least_load",
                max_length=16,
            ),
        ),
    ]
