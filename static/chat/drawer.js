// The conversation list as a drawer on narrow screens (style.css shows the toggle below 700 px): the
// toggle opens and closes it, and so do Esc and the drawer's Close button (a conversation's link leaves the page).
// Open, the drawer is modal, as a panel that covers the page must be for a keyboard or screen-reader
// user: everything else on the page is `inert` (Tab cannot reach it, nor a click, and the accessibility
// tree hides it), focus goes into the drawer and back to the toggle when it closes. Widening the window
// past the phone layout closes it, or the page behind would stay inert with the drawer no longer over it.
"use strict";

(() => {
  const layout = document.querySelector(".chat-layout");
  const toggle = document.getElementById("drawer-toggle");
  const drawer = document.getElementById(toggle?.getAttribute("aria-controls") ?? "");
  if (!layout || !toggle || !drawer) return;
  const phone = window.matchMedia("(max-width: 700px)");
  // What lies behind the open drawer: every element beside it, beside its layout, and so on up to <body>.
  const behind = () => {
    const found = [];
    for (let node = drawer; node.parentElement && node !== document.body; node = node.parentElement) {
      found.push(...[...node.parentElement.children].filter((sibling) => sibling !== node && sibling.tagName !== "SCRIPT"));
    }
    return found;
  };
  const setOpen = (open) => {
    layout.classList.toggle("drawer-open", open);
    toggle.setAttribute("aria-expanded", String(open));
    behind().forEach((element) => { element.inert = open; });
    if (open) drawer.querySelector("a, button")?.focus();
    else if (drawer.contains(document.activeElement) || document.activeElement === document.body) toggle.focus();
  };
  const isOpen = () => layout.classList.contains("drawer-open");
  toggle.addEventListener("click", () => setOpen(!isOpen()));
  drawer.querySelector(".drawer-close")?.addEventListener("click", () => setOpen(false));
  // Tab past the drawer's last control comes round to its first (and Shift+Tab the other way) rather than
  // leaving the document for the browser's own controls.
  const wrapTab = (event) => {
    const controls = [...drawer.querySelectorAll("a[href], button, input, select, textarea")]
      .filter((element) => !element.disabled && element.getClientRects().length);
    const [first, last] = [controls[0], controls[controls.length - 1]];
    if (event.shiftKey && document.activeElement === first) last.focus();
    else if (!event.shiftKey && document.activeElement === last) first.focus();
    else return;
    event.preventDefault();
  };
  drawer.addEventListener("keydown", (event) => {
    if (event.key === "Escape") setOpen(false);
    else if (event.key === "Tab" && isOpen()) wrapTab(event);
  });
  phone.addEventListener("change", () => { if (!phone.matches && isOpen()) setOpen(false); });
})();
