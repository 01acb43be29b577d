// Style sheets bundled as text (esbuild's text loader), inserted by the page where it needs them.
declare module "*.css" {
  const text: string;
  export default text;
}
