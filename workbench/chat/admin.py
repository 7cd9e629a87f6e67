from django.contrib import admin

from workbench.chat.models import ChatDefaults, Conversation, Message


class MessageInline(admin.TabularInline):
    model = Message
    extra = 0
    fields = ("role", "content", "shown", "finish_reason", "completion_tokens", "created_at")


@admin.register(Conversation)
class ConversationAdmin(admin.ModelAdmin):
    list_display = ("title", "owner", "created_at", "updated_at")
    list_filter = ("created_at", "updated_at")
    search_fields = ("title", "owner__username")
    inlines = [MessageInline]


@admin.register(Message)
class MessageAdmin(admin.ModelAdmin):
    list_display = ("conversation", "role", "short_content", "finish_reason", "completion_tokens", "created_at")
    list_filter = ("role", "finish_reason", "created_at")
    search_fields = ("content", "error", "conversation__title", "conversation__owner__username")
    # What the reply is checked against when its owner asks to reproduce it: nobody edits that.
    readonly_fields = ("reproduce",)

    @admin.display(description="content")
    def short_content(self, message: Message) -> str:
        return message.content[:80]


@admin.register(ChatDefaults)
class ChatDefaultsAdmin(admin.ModelAdmin):
    list_display = ("user",)
    search_fields = ("user__username", "system_prompt")
