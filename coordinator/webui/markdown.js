// A small Markdown renderer for chat replies: fenced code blocks, inline code, bold,
// italics, headings, lists, block quotes, links (http and https only) and paragraphs.
// Every text is escaped first: a reply can never inject markup.
"use strict";

function escapeHtml(text) {
  return text.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

function renderInline(text) {
  // Code spans first: their text is not formatted further.
  const spans = [];
  let out = escapeHtml(text).replace(/`([^`]+)`/g, (_, code) => {
    spans.push("<code>" + code + "</code>");
    return "\u0000" + (spans.length - 1) + "\u0000";
  });
  out = out
    .replace(/\*\*([^*]+)\*\*/g, "<strong>$1</strong>")
    .replace(/(^|[^*])\*([^*\s][^*]*)\*/g, "$1<em>$2</em>")
    .replace(/\[([^\]]+)\]\((https?:\/\/[^\s)]+)\)/g, '<a href="$2" target="_blank" rel="noopener noreferrer">$1</a>');
  return out.replace(/\u0000(\d+)\u0000/g, (_, i) => spans[Number(i)]);
}

function renderMarkdown(text) {
  const lines = text.split("\n");
  const html = [];
  let paragraph = [];
  let list = null;  // {tag, items}
  const flushParagraph = () => {
    if (paragraph.length) html.push("<p>" + paragraph.map(renderInline).join("<br>") + "</p>");
    paragraph = [];
  };
  const flushList = () => {
    if (list) html.push("<" + list.tag + ">" + list.items.map((i) => "<li>" + renderInline(i) + "</li>").join("") + "</" + list.tag + ">");
    list = null;
  };
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    const fence = line.match(/^\s*```\s*([\w+-]*)\s*$/);
    if (fence) {
      flushParagraph();
      flushList();
      const code = [];
      for (i++; i < lines.length && !/^\s*```\s*$/.test(lines[i]); i++) code.push(lines[i]);
      const lang = fence[1] ? ' class="language-' + escapeHtml(fence[1]) + '"' : "";
      html.push('<pre><code' + lang + ">" + escapeHtml(code.join("\n")) + "</code></pre>");
      continue;
    }
    const heading = line.match(/^(#{1,6})\s+(.*)$/);
    const bullet = line.match(/^\s*[-*+]\s+(.*)$/);
    const numbered = line.match(/^\s*\d+[.)]\s+(.*)$/);
    const quote = line.match(/^>\s?(.*)$/);
    if (heading) {
      flushParagraph();
      flushList();
      const level = heading[1].length;
      html.push("<h" + level + ">" + renderInline(heading[2]) + "</h" + level + ">");
    } else if (bullet || numbered) {
      flushParagraph();
      const tag = bullet ? "ul" : "ol";
      if (list && list.tag !== tag) flushList();
      if (!list) list = { tag, items: [] };
      list.items.push((bullet || numbered)[1]);
    } else if (quote) {
      flushParagraph();
      flushList();
      html.push("<blockquote>" + renderInline(quote[1]) + "</blockquote>");
    } else if (line.trim() === "") {
      flushParagraph();
      flushList();
    } else {
      flushList();
      paragraph.push(line);
    }
  }
  flushParagraph();
  flushList();
  return html.join("\n");
}
