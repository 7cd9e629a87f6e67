"""The admin's operator pages: read-only records, searchable and filterable (nobody edits a log by hand)."""

from django.contrib import admin

from workbench.ops.models import FlagChange, LeakEvent, ReplayCheck, RequestCancel


class ReadOnlyAdmin(admin.ModelAdmin):
    def get_readonly_fields(self, request, obj=None):
        return [field.name for field in self.model._meta.fields]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(FlagChange)
class FlagChangeAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "user", "name", "value", "all_workers", "workers")
    list_filter = ("name", "all_workers", "created_at")
    search_fields = ("name", "user__username", "workers")


@admin.register(RequestCancel)
class RequestCancelAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "user", "worker", "request_id", "owner", "error")
    list_filter = ("worker", "created_at")
    search_fields = ("request_id", "owner", "user__username", "worker")


@admin.register(LeakEvent)
class LeakEventAdmin(ReadOnlyAdmin):
    list_display = ("occurred_at", "worker", "kind", "dropped", "message")
    list_filter = ("kind", "worker", "occurred_at")
    search_fields = ("worker", "message", "engine_run")


@admin.register(ReplayCheck)
class ReplayCheckAdmin(ReadOnlyAdmin):
    list_display = ("recorded_at", "worker", "replay", "bucket", "rows", "max_abs_delta", "divergent",
                    "argmax_agrees", "first_divergent_layer")
    list_filter = ("divergent", "argmax_agrees", "worker", "bucket", "recorded_at")
    search_fields = ("worker", "engine_run")
