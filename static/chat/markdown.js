// Safe markdown for model output (untrusted): the DOM is built with createElement and textContent
// only, never innerHTML, so nothing in the text can become markup or script. Supported: ``` fenced
// code blocks, `inline code`, **bold**, *italic*, paragraphs and line breaks.
"use strict";

function renderMarkdown(target, text) {
  target.replaceChildren();
  const parts = text.split(/```/);
  parts.forEach((part, i) => {
    if (i % 2 === 1) {  // inside a fence: first line may name the language
      const pre = document.createElement("pre");
      const code = document.createElement("code");
      const newline = part.indexOf("\n");
      const language = newline >= 0 ? part.slice(0, newline).trim() : "";
      if (/^[\w+-]{1,20}$/.test(language)) code.dataset.language = language;
      code.textContent = newline >= 0 && language !== "" ? part.slice(newline + 1) : part.replace(/^\n/, "");
      pre.appendChild(code);
      target.appendChild(pre);
      return;
    }
    part.split(/\n{2,}/).forEach((paragraph) => {
      if (!paragraph.trim()) return;
      const p = document.createElement("p");
      paragraph.split("\n").forEach((line, n) => {
        if (n > 0) p.appendChild(document.createElement("br"));
        appendInline(p, line);
      });
      target.appendChild(p);
    });
  });
}

function appendInline(parent, line) {
  const pattern = /(`[^`]+`|\*\*[^*]+\*\*|\*[^*\s][^*]*\*)/g;
  let last = 0;
  for (const match of line.matchAll(pattern)) {
    parent.appendChild(document.createTextNode(line.slice(last, match.index)));
    const token = match[0];
    const element = document.createElement(token.startsWith("`") ? "code" : token.startsWith("**") ? "strong" : "em");
    element.textContent = token.startsWith("**") ? token.slice(2, -2) : token.slice(1, -1);
    parent.appendChild(element);
    last = match.index + token.length;
  }
  parent.appendChild(document.createTextNode(line.slice(last)));
}
