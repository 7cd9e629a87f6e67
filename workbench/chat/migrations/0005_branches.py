"""Messages stored before branches: each one follows the message before it (workbench/chat/branches.py).

Before this, only a reply named what it followed (the user message it answers, Message.reply_to), and a
conversation was its messages in creation order. Here every older message that names nothing, but the
first, is linked to the one it followed on that list: a user message to the last message shown before
it (of a reply's versions, the one chosen), a reply to the last user message before it. Nothing else
changes, so each conversation reads as it did.
"""

from django.db import migrations


def link(apps, schema_editor):
    Message = apps.get_model("chat", "Message")
    last_shown: dict[int, int] = {}  # conversation id -> the last message shown so far
    last_user: dict[int, int] = {}
    for message in Message.objects.order_by("conversation_id", "created_at", "id").iterator():
        key = message.conversation_id
        if message.reply_to_id is None:
            follows = last_user.get(key) if message.role == "assistant" else last_shown.get(key)
            if follows is not None:
                Message.objects.filter(pk=message.pk).update(reply_to_id=follows)
        if message.shown:
            last_shown[key] = message.pk
        if message.role == "user":
            last_user[key] = message.pk


class Migration(migrations.Migration):

    dependencies = [
        ('chat', '0004_reply_versions'),
    ]

    operations = [
        migrations.RunPython(link, migrations.RunPython.noop),
    ]
