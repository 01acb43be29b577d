// Types of the wasm-bindgen glue (`reducers.js`, built from web/reducers and served next to app.js): the
// official `ahp` reducers.
export default function init(input?: { module_or_path: string | URL }): Promise<unknown>;
export class Mirror {
  constructor();
  applySnapshot(snapshot: string): void;
  applyEnvelope(envelope: string): void;
  state(uri: string): string | undefined;
  reset(): void;
  free(): void;
}
