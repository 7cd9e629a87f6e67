# The model that wrote each reply (workers may host different models).

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('chat', '0005_branches'),
    ]

    operations = [
        migrations.AddField(
            model_name='message',
            name='model',
            field=models.CharField(blank=True, db_default='', default='', max_length=500),
        ),
    ]
