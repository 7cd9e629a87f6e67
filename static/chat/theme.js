// Light or dark: the system's prefers-color-scheme until the user picks one with the header's toggle;
// the pick is remembered in localStorage and pinned as data-theme on <html> (style.css reads it). Loaded
// in <head>, before the body is painted, so a remembered dark page never flashes light first.
"use strict";

(() => {
  const KEY = "workbench-theme";
  const systemDark = window.matchMedia("(prefers-color-scheme: dark)");
  const stored = () => { try { return localStorage.getItem(KEY); } catch { return null; } };
  const isDark = () => (stored() ?? (systemDark.matches ? "dark" : "light")) === "dark";
  const apply = () => {
    const theme = stored();
    if (theme === "light" || theme === "dark") document.documentElement.dataset.theme = theme;
    else delete document.documentElement.dataset.theme;
    const toggle = document.getElementById("theme-toggle");
    if (toggle) toggle.setAttribute("aria-pressed", String(isDark()));
  };
  apply();
  systemDark.addEventListener("change", apply);
  document.addEventListener("DOMContentLoaded", () => {
    apply();
    document.getElementById("theme-toggle")?.addEventListener("click", () => {
      try { localStorage.setItem(KEY, isDark() ? "light" : "dark"); } catch { /* private mode: this page only */ }
      apply();
    });
  });
})();
