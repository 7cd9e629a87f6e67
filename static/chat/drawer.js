// The conversation list as a drawer on narrow screens (style.css shows the toggle below 700 px): the
// toggle opens and closes it, and so do Esc and the drawer's Close button (a conversation's link leaves the page).
// Focus goes into the drawer when it opens and back to the toggle when it closes, as a keyboard user
// would expect of a panel that covers the page.
"use strict";

(() => {
  const layout = document.querySelector(".chat-layout");
  const toggle = document.getElementById("drawer-toggle");
  const drawer = document.getElementById(toggle?.getAttribute("aria-controls") ?? "");
  if (!layout || !toggle || !drawer) return;
  const setOpen = (open) => {
    layout.classList.toggle("drawer-open", open);
    toggle.setAttribute("aria-expanded", String(open));
    if (open) drawer.querySelector("a, button")?.focus();
    else if (drawer.contains(document.activeElement)) toggle.focus();
  };
  toggle.addEventListener("click", () => setOpen(!layout.classList.contains("drawer-open")));
  drawer.querySelector(".drawer-close")?.addEventListener("click", () => setOpen(false));
  drawer.addEventListener("keydown", (event) => { if (event.key === "Escape") setOpen(false); });
})();
