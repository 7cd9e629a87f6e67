"""A message's content and error store NUL escaped (workbench/chat/stored_text.py): the same text column,
no SQL change. Rows written before read back as they were, unless one holds the private-use U+E000
right before a "0" or another U+E000 (then read as NUL, or as one U+E000)."""

import workbench.chat.stored_text
from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('chat', '0007_message_cached_tokens'),
    ]

    operations = [
        migrations.AlterField(
            model_name='message',
            name='content',
            field=workbench.chat.stored_text.NulEscapedTextField(),
        ),
        migrations.AlterField(
            model_name='message',
            name='error',
            field=workbench.chat.stored_text.NulEscapedTextField(blank=True),
        ),
    ]
