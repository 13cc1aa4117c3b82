"""The admin page's permissions: ``HeldLock`` has no table (``managed = False``), so this creates
only the model state; ``migrate`` then creates its content type and the ``view_locks`` and
``release_locks`` permissions (Django does so for unmanaged models as for any other)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("tasklock", "0001_initial")]

    operations = [
        migrations.CreateModel(
            name="HeldLock",
            fields=[
                ("id", models.AutoField(primary_key=True, serialize=False)),
            ],
            options={
                "verbose_name": "held lock",
                "verbose_name_plural": "held locks",
                "db_table": "tasklock_heldlock_no_table",
                "permissions": [
                    ("view_locks", "Can see held tasklock locks and the fleet's counts"),
                    ("release_locks", "Can force-release a held tasklock lock"),
                ],
                "managed": False,
                "default_permissions": (),
            },
        ),
    ]
