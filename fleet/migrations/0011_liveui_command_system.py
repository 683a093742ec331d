"""Commands the control plane sends on its own are marked `system` (shown as "system", hidden by default)."""

from django.db import migrations, models

# Before this field, commands sent outside an operator action had no audit entry; of those, the periodic
# status polls are certainly the control plane's own.
POLLS = ("ray.status", "ray.job.status", "ray.serve.status")


def mark_polls(apps, schema_editor):
    Command = apps.get_model("fleet", "Command")
    Command.objects.filter(audit_entry__isnull=True, command_type__in=POLLS).update(system=True, created_by=None)


class Migration(migrations.Migration):
    dependencies = [("fleet", "0010_selfupdate_agent_versions")]

    operations = [
        migrations.AddField(model_name="command", name="system", field=models.BooleanField(default=False)),
        migrations.AddIndex(
            model_name="command",
            index=models.Index(fields=["cluster", "system", "-created_at"], name="command_cluster_system_created"),
        ),
        migrations.RunPython(mark_polls, migrations.RunPython.noop),
    ]
