// Render the Mermaid diagrams with the vendored mermaid.min.js, so no page fetches a CDN.
// pymdownx.superfences turns ```mermaid fences into <div class="mermaid"> (fence_div_format);
// Material's built-in Mermaid support looks only for <pre class="mermaid"> and would load
// Mermaid from a CDN, so these divs are ours alone.
(function () {
  function render() {
    if (typeof mermaid === "undefined") {
      console.error("mermaid.min.js did not load: diagrams stay as text");
      return;
    }
    var nodes = document.querySelectorAll("div.mermaid:not([data-processed])");
    if (nodes.length === 0) return;
    mermaid.initialize({ startOnLoad: false, securityLevel: "strict", theme: "neutral" });
    mermaid.run({ nodes: nodes });
  }
  // document$ is Material's page-load stream (it also fires after instant navigation).
  if (typeof document$ !== "undefined") document$.subscribe(render);
  else document.addEventListener("DOMContentLoaded", render);
})();
