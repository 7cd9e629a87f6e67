from django.contrib import admin

from workbench.ops.models import FlagChange


@admin.register(FlagChange)
class FlagChangeAdmin(admin.ModelAdmin):
    list_display = ("created_at", "user", "name", "value", "all_workers", "workers")
    list_filter = ("name", "all_workers", "created_at")
    search_fields = ("name", "user__username", "workers")
    readonly_fields = [field.name for field in FlagChange._meta.fields]

    def has_add_permission(self, request) -> bool:
        return False  # written by flag changes only: an audit log is not edited by hand

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False
