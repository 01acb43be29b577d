//! A turn's attachments as ACP prompt content, within what the agent's `promptCapabilities` accept: text
//! (always), resource links (always), images and audio (when it says so), other embedded files as embedded
//! resources (when it accepts embedded context). An attachment it cannot take is named in the error, and the
//! turn ends with it rather than reaching the agent without it.

use agent_client_protocol::v1::schema::{
    AudioContent, BlobResourceContents, ContentBlock, EmbeddedResource, EmbeddedResourceResource,
    ImageContent, PromptCapabilities, ResourceLink, TextContent,
};

use crate::provider::TurnAttachment;

/// The content blocks for `attachments`, or why the agent cannot take one of them.
pub fn blocks(
    attachments: &[TurnAttachment],
    accepts: &PromptCapabilities,
) -> Result<Vec<ContentBlock>, String> {
    attachments
        .iter()
        .map(|attachment| match attachment {
            TurnAttachment::Text { label, text } => Ok(ContentBlock::Text(TextContent::new(format!(
                "[Attachment: {label}]\n{text}"
            )))),
            TurnAttachment::Link {
                label,
                uri,
                content_type,
            } => Ok(ContentBlock::ResourceLink(
                ResourceLink::new(label.clone(), uri.clone()).mime_type(content_type.clone()),
            )),
            TurnAttachment::Embedded {
                label,
                content_type,
                data,
            } => {
                let refused = |what: &str| {
                    format!("the agent does not accept {what} (attachment {label}, {content_type})")
                };
                if content_type.starts_with("image/") {
                    return match accepts.image {
                        true => Ok(ContentBlock::Image(ImageContent::new(
                            data.clone(),
                            content_type.clone(),
                        ))),
                        false => Err(refused("images")),
                    };
                }
                if content_type.starts_with("audio/") {
                    return match accepts.audio {
                        true => Ok(ContentBlock::Audio(AudioContent::new(
                            data.clone(),
                            content_type.clone(),
                        ))),
                        false => Err(refused("audio")),
                    };
                }
                match accepts.embedded_context {
                    true => Ok(ContentBlock::Resource(EmbeddedResource::new(
                        EmbeddedResourceResource::BlobResourceContents(
                            BlobResourceContents::new(data.clone(), format!("attachment:{label}"))
                                .mime_type(content_type.clone()),
                        ),
                    ))),
                    false => Err(refused("embedded files")),
                }
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_the_agent_does_not_accept_is_named() {
        let image = TurnAttachment::Embedded {
            label: "shot.png".into(),
            content_type: "image/png".into(),
            data: "iVBORw0KGgo=".into(),
        };
        let link = TurnAttachment::Link {
            label: "spec".into(),
            uri: "https://example.com/spec".into(),
            content_type: None,
        };
        let plain = PromptCapabilities::default();
        assert_eq!(
            blocks(std::slice::from_ref(&link), &plain).map(|b| b.len()),
            Ok(1)
        );
        let refused = blocks(&[link.clone(), image.clone()], &plain);
        assert!(refused.is_err_and(|why| why.contains("images") && why.contains("shot.png")));
        let images = PromptCapabilities::default().image(true);
        assert!(matches!(
            blocks(&[image], &images).as_deref(),
            Ok([ContentBlock::Image(_)])
        ));
    }
}
