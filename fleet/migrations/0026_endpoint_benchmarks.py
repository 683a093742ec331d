import uuid

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("fleet", "0025_endpoint_admission"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="EndpointBenchmark",
            fields=[
                ("id", models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                (
                    "status",
                    models.CharField(
                        choices=[
                            ("queued", "Queued"),
                            ("running", "Running"),
                            ("succeeded", "Succeeded"),
                            ("failed", "Failed"),
                        ],
                        default="queued",
                        max_length=16,
                    ),
                ),
                ("concurrency", models.PositiveIntegerField()),
                ("prompt_tokens", models.PositiveIntegerField()),
                ("output_tokens", models.PositiveIntegerField()),
                ("duration_s", models.PositiveIntegerField()),
                ("turns", models.PositiveIntegerField(default=1)),
                ("revision", models.CharField(max_length=200)),
                ("server_args", models.JSONField(blank=True, default=list)),
                (
                    "routing_policy",
                    models.CharField(
                        choices=[
                            ("least_load", "Least load"),
                            ("session", "Session affinity"),
                            ("prefix", "Prompt prefix affinity"),
                        ],
                        max_length=16,
                    ),
                ),
                ("requests_done", models.PositiveIntegerField(default=0)),
                ("report", models.JSONField(blank=True, default=dict)),
                ("failure_message", models.TextField(blank=True, default="")),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("started_at", models.DateTimeField(blank=True, null=True)),
                ("finished_at", models.DateTimeField(blank=True, null=True)),
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
                    "endpoint",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="benchmarks",
                        to="fleet.endpoint",
                    ),
                ),
            ],
            options={
                "ordering": ["-created_at"],
                "indexes": [models.Index(fields=["endpoint", "-created_at"], name="benchmark_endpoint_created")],
            },
        ),
    ]
