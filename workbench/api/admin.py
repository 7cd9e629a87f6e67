from django.contrib import admin

from workbench.api.models import ApiToken


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("prefix", "name", "user", "created_at", "revoked_at")
    list_filter = ("created_at", "revoked_at")
    search_fields = ("prefix", "name", "user__username")
    readonly_fields = ("digest", "prefix", "created_at")  # the token itself is never stored
