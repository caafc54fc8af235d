// Server-sent events read from a fetch response: the live feed when it needs an API key
// header (which EventSource cannot send), and the playground's streamed answers.

/** One event block (the lines between blank lines) as `{event, data}`, or null for comments. */
export function parseEvent(block) {
  let event = "message";
  const data = [];
  for (const line of block.split("\n")) {
    if (!line || line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "data") data.push(value);
    else if (field === "event") event = value;
  }
  return data.length ? { event, data: data.join("\n") } : null;
}

/** The events of a response body, in order, as they arrive. */
export async function* readEvents(body) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let carry = ""; // a CR at a chunk's end may be the first half of a CRLF
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return; // an unterminated last block is dropped, as the SSE spec says
      let text = carry + value;
      carry = "";
      if (text.endsWith("\r")) {
        carry = "\r";
        text = text.slice(0, -1);
      }
      buffer += text.replace(/\r\n?/g, "\n");
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const event = parseEvent(buffer.slice(0, end));
        buffer = buffer.slice(end + 2);
        if (event) yield event;
      }
    }
  } finally {
    reader.cancel().catch(() => {});
  }
}
