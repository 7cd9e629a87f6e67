"""A reply keeps its usage's cached_tokens: the prompt tokens the prefix cache already held.

Replies stored before this have none (null), which the page shows as nothing rather than as 0.
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('chat', '0006_reply_model'),
    ]

    operations = [
        migrations.AddField(
            model_name='message',
            name='cached_tokens',
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
    ]
