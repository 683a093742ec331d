import django.db.models.deletion
import uuid
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("fleet", "0028_catalog_model_cache"),
        ("tenancy", "0004_workspace_quotas"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name="endpointreplica",
            name="adapters",
            field=models.JSONField(blank=True, default=list),
        ),
        migrations.AlterField(
            model_name="command",
            name="command_type",
            field=models.CharField(
                choices=[
                    ("container.create", "container.create"),
                    ("container.start", "container.start"),
                    ("container.stop", "container.stop"),
                    ("container.destroy", "container.destroy"),
                    ("model.download", "model.download"),
                    ("endpoint.start", "endpoint.start"),
                    ("endpoint.stop", "endpoint.stop"),
                    ("endpoint.adapter.load", "endpoint.adapter.load"),
                    ("endpoint.adapter.unload", "endpoint.adapter.unload"),
                    ("ray.head.start", "ray.head.start"),
                    ("ray.worker.start", "ray.worker.start"),
                    ("ray.node.drain", "ray.node.drain"),
                    ("ray.node.stop", "ray.node.stop"),
                    ("ray.status", "ray.status"),
                    ("ray.job.submit", "ray.job.submit"),
                    ("ray.job.status", "ray.job.status"),
                    ("ray.job.stop", "ray.job.stop"),
                    ("ray.serve.status", "ray.serve.status"),
                    ("agent.update", "agent.update"),
                ],
                max_length=32,
            ),
        ),
        migrations.AlterField(
            model_name="usagerollup",
            name="subject_kind",
            field=models.CharField(
                choices=[("endpoint", "Endpoint"), ("adapter", "LoRA adapter"), ("cluster", "Cluster")], max_length=16
            ),
        ),
        migrations.CreateModel(
            name="LoraAdapter",
            fields=[
                ("id", models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                ("name", models.CharField(max_length=64)),
                ("model_id", models.CharField(blank=True, default="", max_length=200)),
                ("revision", models.CharField(default="main", max_length=200)),
                ("path", models.CharField(blank=True, default="", max_length=1000)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                (
                    "created_by",
                    models.ForeignKey(
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="+",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
                (
                    "workspace",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="lora_adapters",
                        to="tenancy.workspace",
                    ),
                ),
            ],
            options={
                "ordering": ["name"],
            },
        ),
        migrations.CreateModel(
            name="EndpointAdapter",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                (
                    "endpoint",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="adapter_links", to="fleet.endpoint"
                    ),
                ),
                (
                    "adapter",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="endpoint_links",
                        to="fleet.loraadapter",
                    ),
                ),
            ],
            options={
                "ordering": ["created_at", "pk"],
            },
        ),
        migrations.AddConstraint(
            model_name="loraadapter",
            constraint=models.UniqueConstraint(fields=("workspace", "name"), name="loraadapter_unique_workspace_name"),
        ),
        migrations.AddConstraint(
            model_name="loraadapter",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    models.Q(("model_id", ""), ("path", ""), _negated=True),
                    models.Q(("model_id", ""), ("path", ""), _connector="OR"),
                ),
                name="loraadapter_repository_or_path",
            ),
        ),
        migrations.AddConstraint(
            model_name="endpointadapter",
            constraint=models.UniqueConstraint(fields=("endpoint", "adapter"), name="endpointadapter_unique"),
        ),
    ]
